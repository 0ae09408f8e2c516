"""The study's LR range test step: run once before the first trial, recorded in the study.

The test runs in its own process forked from the trial runner's forkserver, like a trial; its
result becomes the Optuna study user attr `lr_range_test` ({"low", "high", ...}), so a resumed
study (or another worker) reuses it instead of re-running it, and the search-space entries with
`from_lr_range_test` take their bounds from it.

Once per study: the test runs under the study's budget lock (stores/budget_lock.py), and the study
is read again once the lock is held, so of several workers started together one runs the test and
the others wait for it and read its result. Where no lock can be taken (the gRPC storage proxy) the
workers queue with claim trials instead (lr_claim.py): the first live claim runs the test, the others
wait for its result and take over when its holder is gone. A second Ctrl-C/SIGTERM kills the test;
nothing is recorded and the next run starts it again (the driver exits 130/143 like any interrupted run).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import optuna

from hpolab.config.spec import FloatDist, StudySpec
from hpolab.errors import StudyError
from hpolab.stores import mlflow_runs as tr
from hpolab.stores.budget_lock import budget_lock
from hpolab.stores.paths import Stores
from hpolab.study.lr_test.lr_claim import LRTestClaim
from hpolab.study.trials.runner import TrialRunner, spawn_with_lifeline


def lr_bounds(study: optuna.Study) -> tuple[float, float] | None:
    """The recorded (low, high) of the LR range test, or None when the study has none."""
    b = study.user_attrs.get("lr_range_test")
    return (b["low"], b["high"]) if b else None


# A worker waits this long for another worker's LR range test (it holds the budget lock meanwhile).
LR_TEST_LOCK_TIMEOUT = float(os.environ.get("HPOLAB_LR_TEST_LOCK_TIMEOUT", "3600"))


def _run_child(spec: StudySpec, out_dir: Path, runner: TrialRunner, project_dir: Path,
               note: Callable[[str], None], aborting: Callable[[], bool]) -> tuple[str, dict[str, Any]] | None:
    """Run the test in a child process; its one message, ("done" | "fail", info), or None when a
    second Ctrl-C/SIGTERM stopped it."""
    from hpolab.study.lr_test import lr_range as lr_find  # lazily: it pulls in torch; only a study with the test needs it

    job = lr_find.make_job(spec, out_dir, project_dir=project_dir, threads=runner.cpus(),
                           cuda_device=runner.devices_for(runner.least_used_gpu([])))
    note("running the LR range test before the first trial ...")
    try:
        proc, conn, lifeline = spawn_with_lifeline(
            runner.context(), lr_find.run_in_process, "lr-range-test", lambda c, life: (c, job, life))
    except (EOFError, OSError) as e:  # the forkserver is gone (killed with the process group?)
        if aborting():
            return None
        raise StudyError(f"could not start the LR range test process: {type(e).__name__}: {e}") from None
    msg = None
    while msg is None:
        try:
            if conn.poll(1.0):
                msg = conn.recv()
                continue
        except (EOFError, OSError):  # it died: its pipe closed
            proc.join(timeout=10)
        if not proc.is_alive():
            msg = ("fail", {"reason": f"the LR range test process died (exit code {proc.exitcode})", "traceback": ""})
        elif aborting():
            proc.kill()
            proc.join(timeout=30)
            lifeline.close()
            return None
    proc.join(timeout=30)
    lifeline.close()
    return msg


def ensure_lr_range_test(spec: StudySpec, study: optuna.Study, stores: Stores, runner: TrialRunner, project_dir: Path,
                         client, experiment_id: str, parent_run_id: str,
                         note: Callable[[str], None], aborting: Callable[[], bool]) -> None:
    """Run the study's LR range test once (in its own process, like a trial) and record it in
    the study, so a resumed study (or another worker) reuses it instead of re-running it."""
    if not spec.lr_range_test.enabled or study.user_attrs.get("lr_range_test"):
        return
    args = (spec, study, stores, runner, project_dir, client, experiment_id, parent_run_id, note, aborting)
    storage = getattr(study._storage, "_backend", study._storage)  # the RDBStorage under Optuna's cache: it has the engine
    with budget_lock(storage, spec.name, timeout=LR_TEST_LOCK_TIMEOUT) as locked:
        if locked:
            if study.user_attrs.get("lr_range_test"):  # another worker ran it while we waited for the lock
                note("using the LR range test another worker ran for this study")
                return
            _run_and_record(*args)
            return
    _run_by_claim(study, note, aborting, args)  # no lock through this storage (the gRPC proxy): queue with a claim trial


def _run_by_claim(study: optuna.Study, note: Callable[[str], None], aborting: Callable[[], bool], args: tuple) -> None:
    """Take a claim ticket (lr_claim.py); run the test (`_run_and_record(*args)`) when it is first,
    else use the result the worker ahead recorded. The ticket is ended however this returns, so the
    next one goes on."""
    recorded = lambda: bool(study.user_attrs.get("lr_range_test"))  # noqa: E731
    claim = LRTestClaim(study)
    number = claim.take()
    ended = "interrupted"
    try:
        if not claim.wait_for_turn(recorded, LR_TEST_LOCK_TIMEOUT, aborting):
            if recorded():
                note("using the LR range test another worker ran for this study")
                ended = "used another worker's result"
            return
        note(f"this worker runs the study's LR range test (claim trial {number})")
        ended = "failed"
        with claim.beating():
            _run_and_record(*args)
        ended = "recorded" if recorded() else "stopped without a result"
    finally:
        claim.end(ended)


def _run_and_record(spec: StudySpec, study: optuna.Study, stores: Stores, runner: TrialRunner, project_dir: Path,
                    client, experiment_id: str, parent_run_id: str,
                    note: Callable[[str], None], aborting: Callable[[], bool]) -> None:
    from hpolab.study.lr_test import lr_range as lr_find  # lazily: it pulls in torch; only a study with the test needs it

    out_dir = lr_find.default_out_dir(stores, spec)
    msg = _run_child(spec, out_dir, runner, project_dir, note, aborting)
    if msg is None:
        note("LR range test stopped; it runs again on the next run")
        return
    kind, info = msg
    if kind == "fail":
        raise StudyError(f"the LR range test failed: {info['reason']}")
    result = lr_find.LRRangeResult.from_dict(info["result"])
    if study.user_attrs.get("lr_range_test"):  # a claim taken over from this stalled worker: the first result stands
        note("another worker recorded the study's LR range test meanwhile; using its result")
        return
    run_id = lr_find.log_to_mlflow(client, experiment_id, parent_run_id, result, out_dir, {"optuna.study": spec.name})
    note(info["summary"])
    attr = lr_find.study_user_attr(result, run_id)
    if attr is None:
        raise StudyError(
            f"the LR range test gave no usable suggestion ({result.warning}); see its plot in {out_dir}. "
            "Give explicit low/high for the search-space entries that use from_lr_range_test."
        )
    study.set_user_attr("lr_range_test", attr)
    low, high = attr["low"], attr["high"]
    used = [p for p, d in spec.search_space.items() if isinstance(d, FloatDist) and d.from_lr_range_test]
    params = {}
    for p in used:
        params[f"search_space.{p}.low"] = repr(low)
        params[f"search_space.{p}.high"] = repr(high)
    params["lr_range_test.run_id"] = run_id
    params["lr_range_test.bounds_rule"] = "low = suggestion/10, high = min(suggestion*10, divergence LR)"
    tr.log_params(client, parent_run_id, params)
    note(f"search bounds from the LR range test: [{low:.3g}, {high:.3g}] for {', '.join(used) or 'no entry'}")

