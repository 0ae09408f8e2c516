"""A trial fails alone; the driver can die; nothing is lost. Real processes, real signals.

These run the real CLI in tests/fault_project, whose `faulty` experiment misbehaves on request.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, open_study, run_cli, start_cli, trial_run, wait_for_checkpoints

PROJECT = FAULT_PROJECT
SPEC = FAULT_SPEC
_open = open_study
_run = trial_run


@pytest.mark.slow
def test_each_failure_ends_its_trial_only(store):
    # One study, one trial per misbehaviour (grid sampler over model.fault), two at a time.
    # No trial completes (the healthy one is pruned): exit 1. max_retries=0: the hang is not retried.
    out = run_cli(
        "--store", str(store), "study", "run", SPEC,
        "n_trials=6", "parallel=2", "trial_timeout=20", "max_retries=0", "max_failures=null", "log_models=none",
        "sampler={type: grid}",
        "search_space={model.fault: {type: categorical, choices: [none, raise, nan, sigkill, segfault, hang]}}",
        "model.fault_after=3",
        "pruner={type: threshold, kwargs: {lower: 0.99}}",  # the healthy trial is pruned at epoch 1
        cwd=PROJECT, check=False,
    )
    assert out.returncode == 1 and "no trial completed" in out.stderr, out.stdout + out.stderr
    client, study = _open(store)
    by_fault = {t.params["model.fault"]: t for t in study.get_trials()}
    assert set(by_fault) == {"none", "raise", "nan", "sigkill", "segfault", "hang"}, out.stdout

    expected = {
        "raise": "RuntimeError: the experiment's model raised on purpose",
        "nan": "loss is nan",
        "sigkill": "killed by SIGKILL",
        "segfault": "killed by SIGSEGV",
        "hang": "exceeded trial_timeout (20 s)",
    }
    for fault, words in expected.items():
        t = by_fault[fault]
        assert t.state == TrialState.FAIL, fault
        run = _run(t, client)
        assert run.info.status == "FAILED"
        assert run.data.tags["hpolab.state"] == "FAIL"
        assert words.lower() in run.data.tags["hpolab.fail_reason"].lower(), (fault, run.data.tags["hpolab.fail_reason"])
    for fault in ("raise", "nan"):  # Python-level failures keep their traceback
        run = _run(by_fault[fault], client)
        assert "traceback.txt" in [a.path for a in client.list_artifacts(run.info.run_id)]

    # the healthy trial was pruned, and MLflow says so (never shown as a success)
    t = by_fault["none"]
    assert t.state == TrialState.PRUNED
    run = _run(t, client)
    assert run.info.status == "KILLED"
    assert run.data.tags["hpolab.state"] == "PRUNED"
    assert run.data.tags["hpolab.pruned_at_epoch"] == "1"
    assert len(client.get_metric_history(run.info.run_id, "val_acc")) == 1

    assert not [t for t in study.get_trials() if t.state == TrialState.RUNNING]
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.data.tags["hpolab.trials_finished"] == "6"


@pytest.mark.slow
def test_cuda_oom_is_retried_with_half_the_micro_batch(store):
    # Fault injection raises torch.cuda.OutOfMemoryError at micro-step 3 (works on CPU). The retry is
    # a new attempt (trial 1, its own run) with half the micro-batch (tests/test_faults.py: continuity).
    run_cli("--store", str(store), "study", "run", SPEC, "n_trials=1", "trainer.inject_oom_at_step=3", "log_models=none",
            "trainer.batch_size=128", "trainer.grad_accum_steps=1", cwd=PROJECT)
    client, study = _open(store)
    first, t = study.get_trials()
    assert first.state == TrialState.FAIL and t.state == TrialState.COMPLETE
    run = _run(t, client)
    assert "batch_size=64" in run.data.tags["hpolab.trainer_overrides"] and "grad_accum_steps=2" in run.data.tags["hpolab.trainer_overrides"]
    assert "traceback.txt" in [a.path for a in client.list_artifacts(_run(first, client).info.run_id)]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")] == [1, 2, 3]


def _start_driver(store: Path, *args: str, env: dict):
    return start_cli("--store", str(store), "study", "run", SPEC, *args, cwd=PROJECT, env=env,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)



def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (already dead, not yet reaped) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_driver_killed_then_resumed(store, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**hpolab_env(), "HPOLAB_TEST_PID_DIR": str(pids), "HPOLAB_HEARTBEAT_INTERVAL": "1", "HPOLAB_GRACE_PERIOD": "4"}
    args = ["n_trials=3", "parallel=2", "trainer.max_epochs=8", "model.sleep=0.03", "log_models=none"]
    driver = _start_driver(store, *args, env=env)
    wait_for_checkpoints(store, 2)
    driver.kill()  # SIGKILL: no cleanup code runs in the driver
    driver.wait()

    # its trial processes exit on their own within seconds (the lifeline pipe closed)
    children = [int(p.stem) for p in pids.glob("*.pid")]
    assert children
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in children if _alive(p)], "orphaned trial processes"

    client, study = _open(store)
    dead = [t for t in study.get_trials() if t.state == TrialState.RUNNING]
    assert dead, "the killed driver's trials are left RUNNING until someone notices"
    dead_epochs = {t.number: max(t.intermediate_values) for t in dead if t.intermediate_values}

    time.sleep(4)  # let the heartbeats go stale
    run_cli("--store", str(store), "study", "run", SPEC, *args, cwd=PROJECT, env=env)

    client, study = _open(store)
    trials = study.get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    retries = [t for t in trials if t.system_attrs.get("retry_history")]
    assert {t.system_attrs["retry_history"][-1] for t in retries} == {t.number for t in dead}
    for t in retries:
        old = t.system_attrs["retry_history"][-1]
        assert t.params == study.trials[old].params
        run = _run(t, client)
        assert run.data.tags["hpolab.retry_of_trial"] == str(old)
        assert run.data.tags["hpolab.retry_of_run"] == study.trials[old].user_attrs["mlflow_run_id"]
        if old in dead_epochs:  # it resumed from the dead trial's checkpoint: its epochs continue
            assert "hpolab.resumed_from" in run.data.tags
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "val_acc"))
            assert steps == list(range(1, 9))  # epochs 1..k carried over from the checkpoint, then k+1..8 trained
            assert sorted(t.intermediate_values) == list(range(1, 9))
            assert run.data.tags["hpolab.epochs_run"] == "8"
        # the dead trial's run is closed with the reason, not left RUNNING
        dead_run = _run(study.trials[old], client)
        assert dead_run.info.status == "FAILED"
        assert "is gone" in dead_run.data.tags["hpolab.fail_reason"]  # same host: seen without the grace period
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 3  # the budget counts finished trials; no trial ran twice to completion


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_the_study_resumes(store):
    args = ["n_trials=2", "parallel=2", "trainer.max_epochs=8", "model.sleep=0.03", "log_models=none"]
    driver = _start_driver(store, *args, env=hpolab_env())
    wait_for_checkpoints(store, 2)
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=60)
    assert driver.returncode == 130, out
    assert "Ctrl-C" in out

    client, study = _open(store)
    trials = study.get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    interrupted = [t for t in trials if t.state == TrialState.FAIL]
    assert interrupted
    for t in interrupted:
        run = _run(t, client)
        assert "interrupted" in run.data.tags["hpolab.fail_reason"]
        assert run.info.status == "FAILED"
    assert len([t for t in trials if t.state == TrialState.WAITING]) == len(interrupted)

    run_cli("--store", str(store), "study", "run", SPEC, *args, cwd=PROJECT)
    client, study = _open(store)
    trials = study.get_trials()
    assert len([t for t in trials if t.state == TrialState.COMPLETE]) == 2
    resumed = [t for t in trials if t.system_attrs.get("retry_history")]
    assert resumed and all("hpolab.resumed_from" in _run(t, client).data.tags for t in resumed)


@pytest.mark.slow
def test_study_timeout_stops_starting_trials(store):
    # Each forward call sleeps 0.1 s: the first trial takes seconds on any machine, so it is still
    # running when the 1 s study timeout passes (a lower bound on its time, not an upper one).
    out = run_cli("--store", str(store), "study", "run", SPEC, "n_trials=10", "parallel=1", "timeout=1", "model.sleep=0.1", "log_models=none", cwd=PROJECT)
    assert "timeout (1 s) reached" in out.stdout
    client, study = _open(store)
    trials = study.get_trials()
    assert len(trials) == 1 and trials[0].state == TrialState.COMPLETE  # the running trial finished normally
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.info.status == "KILLED"  # the budget is not done; re-running continues


@pytest.mark.slow
def test_direction_change_of_an_existing_study_is_refused(store):
    run_cli("--store", str(store), "study", "run", SPEC, "n_trials=1", "trainer.max_epochs=1", "log_models=none", cwd=PROJECT)
    out = run_cli("--store", str(store), "study", "run", SPEC, "n_trials=2", "metric=val_loss", "direction=minimize", "log_models=none",
                  cwd=PROJECT, check=False)
    assert out.returncode == 2  # the study remembers its spec: refused with the diff (test_study_controls.py)
    assert 'direction: "maximize" -> "minimize"' in out.stderr and "--new-study" in out.stderr and "Traceback" not in out.stderr
