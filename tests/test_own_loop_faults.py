"""An own training loop under the faults the routine's trials survive: the driver SIGKILLed mid-study
and re-run at once (the killed trials resume from their last trial.checkpoint), and two workers
sharing one study. Real CLI, real processes (tests/own_loop_project)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import open_study, run_cli, start_cli, trial_run

PROJECT = Path(__file__).parent / "own_loop_project"
SPEC = "studies/tiny_loop.yaml"
STUDY = "tiny-loop"


def _wait_for_epoch(store: Path, epoch: int, n: int, timeout: float = 120) -> None:
    """Until `n` trials have checkpointed epoch `epoch` (they are mid-training)."""
    from hpolab.train.checkpoint import load_checkpoint

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = 0
        for last in (store / "trials" / STUDY).glob("trial-*/last.pt"):
            try:
                done += load_checkpoint(last)["epoch"] >= epoch
            except Exception:  # being replaced this moment
                pass
        if done >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {n} trials reached epoch {epoch} in time")


def _check_clean(store: Path) -> None:
    out = run_cli("--store", str(store), "study", "check", STUDY, cwd=PROJECT, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_a_sigkilled_driver_rerun_resumes_trials_from_their_last_checkpoint(store):
    args = ["n_trials=2", "trainer.max_epochs=6", "model.sleep=0.4", "pruner={type: none}", "log_models=none"]
    driver = start_cli("--store", str(store), "study", "run", SPEC, *args, cwd=PROJECT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for_epoch(store, 2, 2)
    driver.kill()
    driver.wait()
    out = run_cli("--store", str(store), "study", "run", SPEC, *args, cwd=PROJECT)
    assert "is gone; retried as trial" in out.stdout, out.stdout
    client, study = open_study(store, STUDY)
    trials = study.get_trials()
    retries = [t for t in trials if t.system_attrs.get("retry_history")]
    assert len(retries) == 2 and all(t.state == TrialState.COMPLETE for t in retries), [t.state for t in trials]
    for t in retries:
        run = trial_run(t, client)
        resumed = int(run.data.tags["hpolab.resumed_after_epoch"])
        assert resumed >= 2
        steps = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "steps"))
        # one continuous epoch axis, and the optimizer steps counted on from the restored state
        assert steps == [(e, float(e)) for e in range(1, 7)]
        starts = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "start_epoch")}
        assert starts[6] == resumed + 1 and starts[1] == 1  # epochs 1..k carried over from the killed attempt
        assert t.intermediate_values == pytest.approx({e: t.params["model.quality"] * e / 6 for e in range(1, 7)})
    _check_clean(store)


@pytest.mark.slow
def test_two_workers_share_one_study(store):
    args = ["n_trials=6", "parallel=1", "sampler={type: random}", "pruner={type: none}", "model.sleep=0.05"]
    procs = [start_cli("--store", str(store), "worker", SPEC, *args, cwd=PROJECT, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    client, study = open_study(store, STUDY)
    trials = study.get_trials()
    assert len(trials) == 6 and all(t.state == TrialState.COMPLETE for t in trials)
    for t in trials:
        run = trial_run(t, client)
        assert run.data.tags["hpolab.state"] == "COMPLETE" and [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")] == [1, 2, 3]
    started = [re.findall(r"trial (\d+) started", out) for out in outs]
    assert all(started) and sorted(int(n) for ns in started for n in ns) == list(range(6))  # each ran some, none twice
    _check_clean(store)


@pytest.mark.slow
def test_sigterm_stops_the_loop_at_its_next_report_and_the_rerun_resumes_it(store):
    args = ["n_trials=2", "trainer.max_epochs=6", "model.sleep=0.4", "pruner={type: none}", "log_models=none"]
    driver = start_cli("--store", str(store), "study", "run", SPEC, *args, cwd=PROJECT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for_epoch(store, 2, 2)
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=60)
    assert driver.returncode == 143, out
    client, study = open_study(store, STUDY)
    stopped = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert len(stopped) == 2
    for t in stopped:  # train() returned after its report was answered True: an interrupted trial, not a COMPLETE one
        tags = trial_run(t, client).data.tags
        assert tags["hpolab.fail_kind"] == "interrupted" and tags["hpolab.stop_reason"] == "stopped_by_caller"
    run_cli("--store", str(store), "study", "run", SPEC, *args, cwd=PROJECT)
    client, study = open_study(store, STUDY)
    done = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert len(done) == 2 and all(t.system_attrs.get("retry_history") for t in done)
    for t in done:
        steps = sorted((m.step, m.value) for m in client.get_metric_history(trial_run(t, client).info.run_id, "steps"))
        assert steps == [(e, float(e)) for e in range(1, 7)]
    _check_clean(store)
