"""Every kill point of the trial lifecycle, proven: for a plain, an own-loop, an ASHA and a PBT study,
the driver is SIGKILLed before and after each transition it passes (the list is read from the
lifecycle's transition table) and re-run at once; the stores still agree (tests/kill_harness.py).
The counts and times are printed (pytest -s)."""

from __future__ import annotations

import pytest

from hpolab.stores.trial_states import TRANSITIONS
from kill_harness import KINDS, LIFECYCLE_KIND, enumerate_kills, kill_points, kills_beside_a_worker


def test_the_kill_points_are_read_from_the_transition_table():
    # every transition a study kind passes is enumerated for it, before and after; none is made up here
    names = {t.name for t in TRANSITIONS}
    for kind in KINDS:
        points = kill_points(kind)
        assert {n for n, _ in points} <= names and len(points) == 2 * sum(LIFECYCLE_KIND.get(kind, kind) in t.studies for t in TRANSITIONS)
    assert ("put_back", "before") in kill_points("asha") and ("exploit_copied", "after") in kill_points("pbt")
    assert ("reaped", "after") in kill_points("plain") and ("pause", "before") not in kill_points("plain")
    assert kill_points("own_loop") == kill_points("plain")  # an own loop passes the routine's transitions


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_driver_killed_at_every_transition_and_rerun_at_once_keeps_the_stores_agreeing(store, tmp_path, kind):
    report = enumerate_kills(store, kind, tmp_path)
    assert sorted(report.killed) == sorted(":".join(p) for p in kill_points(kind))
    print(f"\nKILL POINTS {kind}: {len(report.killed)} kills in {report.runs} driver runs over {len(report.studies)} "
          f"studies, {report.seconds:.0f} s")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["asha", "pbt"])
def test_a_second_worker_lives_through_every_kill_of_the_driver_beside_it(store, tmp_path, kind):
    report = kills_beside_a_worker(store, kind, tmp_path)
    assert report.killed, report.log  # (the points the worker took instead are passed over)
    print(f"\nKILL POINTS {kind} beside a worker: {len(report.killed)} of {len(kill_points(kind))} reached by the killed "
          f"driver, {report.runs} runs, {len(report.studies)} studies, {report.seconds:.0f} s")


def test_the_architecture_page_shows_the_transition_table():
    from pathlib import Path

    from hpolab.stores.trial_states import diagram

    page = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    shown = page.split("<!-- lifecycle:begin -->\n```\n", 1)[1].split("\n```\n<!-- lifecycle:end -->", 1)[0]
    assert shown == diagram(), ("docs/architecture.md's state diagram is out of date: paste the output of "
                                "python -c 'from hpolab.stores.trial_states import diagram; print(diagram())'")
