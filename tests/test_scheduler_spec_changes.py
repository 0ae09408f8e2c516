"""What a trial scheduler's spec may and may not say, through the real CLI: a change of trial_scheduler
while trials are paused (only the recorded scheduler resumes them) and PBT mutations that cannot work
are refused in one line that names the field and the fix."""

from __future__ import annotations

import pytest

from conftest import open_study, run_cli
from kill_harness import FAULT_PROJECT, KINDS, run_driver


@pytest.mark.slow
def test_dropping_the_trial_scheduler_while_trials_are_paused_is_refused(store, tmp_path):
    killed = run_driver(store, "asha", "strand", ("pause", "after", "2"), tmp_path)  # trials 0 and 1 paused at rung 0
    assert killed.killed_at, killed.output
    _, _, args, _ = KINDS["asha"]
    plain = [a for a in args if not a.startswith("trial_scheduler=")]
    out = run_cli("--store", str(store), "study", "run", "studies/faulty.yaml", "name=strand", *plain, "--allow-spec-change",
                  cwd=FAULT_PROJECT, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "trial_scheduler changed while 2 trials are paused (trial 0, 1)" in out.stderr and "--new-study strand-2" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    _, study = open_study(store, "strand")
    assert len(study.get_trials()) == 2  # nothing was written: the recorded spec still runs them
    again = run_driver(store, "asha", "strand", None, tmp_path)
    assert again.returncode == 0, again.output
