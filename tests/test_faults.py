"""Faults a real cluster throws: real CLI, real processes, real signals.

Each test is one fault: a child dying while the driver answers it, SIGTERM, an immediate restart
after the driver was SIGKILLed, OOM and timeout retries that continue as new attempts, the failure
limit and exit codes, and a reproduce of a pruned trial.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, open_study, run_cli, start_cli, trial_run, wait_for_checkpoints

PROJECT = FAULT_PROJECT
SPEC = FAULT_SPEC
_open = open_study
_run = trial_run


def _check_clean(store: Path) -> None:
    """Both stores tell the same story: `hpolab study check` (the real CLI) is clean."""
    out = run_cli("--store", str(store), "study", "check", "faulty", cwd=PROJECT, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def _steps(client, run_id: str, metric: str = "val_acc") -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, metric))


def _start(store: Path, *args: str, env: dict | None = None):
    return start_cli("--store", str(store), "study", "run", SPEC, *args, cwd=PROJECT, env=env,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)



@pytest.mark.slow
def test_child_dead_at_the_reply_ends_its_trial_only(store):
    # The child exits right after sending its epoch: the driver's "continue" meets a closed pipe.
    out = run_cli("--store", str(store), "study", "run", SPEC, "n_trials=2", "parallel=2", "sampler={type: grid}",
                  "search_space={model.fault: {type: categorical, choices: [none, exit_after_epoch]}}", "log_models=none", cwd=PROJECT)
    client, study = _open(store)
    by_fault = {t.params["model.fault"]: t for t in study.get_trials()}
    assert by_fault["none"].state == TrialState.COMPLETE, out.stdout
    dead = by_fault["exit_after_epoch"]
    assert dead.state == TrialState.FAIL
    assert "exited with code 3" in _run(dead, client).data.tags["hpolab.fail_reason"]
    assert _run(dead, client).info.status == "FAILED"
    _check_clean(store)


@pytest.mark.slow
def test_sigterm_stops_gracefully_exits_143_and_resumes(store):
    args = ["n_trials=2", "parallel=2", "trainer.max_epochs=8", "model.sleep=0.03", "log_models=none"]
    driver = _start(store, *args)
    wait_for_checkpoints(store, 2)
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=60)
    assert driver.returncode == 143, out
    assert "SIGTERM" in out and "re-run the same command to resume" in out
    client, study = _open(store)
    trials = study.get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    stopped = [t for t in trials if t.state == TrialState.FAIL]
    assert stopped and len([t for t in trials if t.state == TrialState.WAITING]) == len(stopped)
    assert all(_run(t, client).info.status == "FAILED" for t in stopped)
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.info.status == "KILLED"

    run_cli("--store", str(store), "study", "run", SPEC, *args, cwd=PROJECT)
    client, study = _open(store)
    done = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert len(done) == 2
    for t in done:
        if t.system_attrs.get("retry_history"):
            assert _steps(client, _run(t, client).info.run_id) == list(range(1, 9))  # one continuous curve
    _check_clean(store)


@pytest.mark.slow
def test_immediate_restart_after_sigkill_finishes_the_budget(store):
    # Default heartbeats (10 s, 60 s grace): the restart must not wait for them, the owner is gone.
    args = ["n_trials=3", "parallel=2", "trainer.max_epochs=6", "model.sleep=0.03", "log_models=none"]
    driver = _start(store, *args)
    wait_for_checkpoints(store, 2)
    driver.kill()
    driver.wait()
    out = run_cli("--store", str(store), "study", "run", SPEC, *args, cwd=PROJECT)
    assert "is gone; retried as trial" in out.stdout  # seen at once, not after the 60 s grace period
    client, study = _open(store)
    trials = study.get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    final = [t for t in trials if t.number not in retried]
    assert len(final) == 3 and all(t.state == TrialState.COMPLETE for t in final)
    for t in trials:
        assert _run(t, client).info.status != "RUNNING"
        assert _run(t, client).data.tags["hpolab.state"] == t.state.name
    _check_clean(store)


@pytest.mark.slow
def test_oom_retry_is_a_new_attempt_that_continues(store):
    # 1000 samples / 128 = 8 micro-steps per epoch: micro-step 12 is in epoch 2.
    run_cli("--store", str(store), "study", "run", SPEC, "n_trials=1", "trainer.inject_oom_at_step=12", "log_models=none",
            "trainer.batch_size=128", "trainer.grad_accum_steps=1", cwd=PROJECT)
    client, study = _open(store)
    first, retry = study.get_trials()
    assert first.state == TrialState.FAIL and retry.state == TrialState.COMPLETE
    r0, r1 = _run(first, client), _run(retry, client)
    assert r0.data.tags["hpolab.fail_kind"] == "oom" and "retried as trial 1" in r0.data.tags["hpolab.fail_reason"]
    assert r1.data.tags["hpolab.retry_of_trial"] == "0" and r1.data.tags["hpolab.retry_of_run"] == r0.info.run_id
    assert "batch_size=64" in r1.data.tags["hpolab.trainer_overrides"]
    assert r1.data.params["trainer.batch_size"] == "64" and r1.data.params["trainer.grad_accum_steps"] == "2"
    assert _steps(client, r0.info.run_id) == [1]
    assert _steps(client, r1.info.run_id) == [1, 2, 3]  # epoch 1 carried over from the checkpoint
    assert sorted(retry.intermediate_values) == [1, 2, 3]
    _check_clean(store)


@pytest.mark.slow
def test_timeout_retry_resumes_from_the_checkpoint(store):
    # ~10 forward calls per epoch: call 15 hangs in epoch 2 of the first attempt; the retry resumes
    # after epoch 1 in a fresh process and needs only 10 calls for epoch 2. The timeout is far above
    # what an epoch takes even on a loaded machine (under a second here; the trial's process is a fork
    # of the command's forkserver, with nothing left to import): the hang never ends, so only the wait grows.
    run_cli("--store", str(store), "study", "run", SPEC, "n_trials=1", "trial_timeout=15", "trainer.max_epochs=2",
            "model.fault=hang", "model.fault_after=15", "log_models=none", cwd=PROJECT)
    client, study = _open(store)
    first, retry = study.get_trials()
    assert first.state == TrialState.FAIL and retry.state == TrialState.COMPLETE
    r0, r1 = _run(first, client), _run(retry, client)
    assert r0.data.tags["hpolab.fail_kind"] == "timeout" and "trial_timeout (15 s)" in r0.data.tags["hpolab.fail_reason"]
    assert r1.data.tags["hpolab.retry_of_run"] == r0.info.run_id and "hpolab.resumed_from" in r1.data.tags
    assert _steps(client, r1.info.run_id) == [1, 2]
    _check_clean(store)


@pytest.mark.slow
def test_failure_limit_and_exit_codes(store):
    out = run_cli("--store", str(store), "study", "run", SPEC, "n_trials=5", "max_failures=2", "model.fault=raise", "log_models=none",
                  cwd=PROJECT, check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "failure limit" in out.stderr and "2 trials failed in a row (max_failures=2)" in out.stderr
    _, study = _open(store)
    assert len(study.get_trials()) == 2

    # (each re-run changes the model's fault settings: a spec change the study must be told about)
    out = run_cli("--store", str(store), "study", "run", SPEC, "n_trials=3", "max_failures=null", "model.fault=raise",
                  "model.fault_after=0", "log_models=none", "--allow-spec-change", cwd=PROJECT, check=False)
    assert out.returncode == 1 and "no trial completed (3 failed" in out.stderr, out.stderr
    out = run_cli("--store", str(store), "study", "run", SPEC, "n_trials=4", "log_models=none", "--allow-spec-change", cwd=PROJECT, check=False)
    assert out.returncode == 0, out.stderr
    out = run_cli("--store", str(store), "study", "run", SPEC, "n_trials=4", "max_failures=0", "log_models=none", cwd=PROJECT, check=False)
    assert out.returncode == 2 and "max_failures" in out.stderr
    _check_clean(store)


@pytest.mark.slow
def test_reproduce_of_a_pruned_trial_matches(store):
    # Cosine over 3 epochs, pruned after epoch 1: reproducing with max_epochs=1 would change the LR.
    run_cli("--store", str(store), "study", "run", SPEC, "n_trials=1", "trainer.scheduler=cosine",
            "pruner={type: threshold, kwargs: {lower: 0.99}}", "log_models=none", cwd=PROJECT, check=False)
    client, study = _open(store)
    (t,) = study.get_trials()
    assert t.state == TrialState.PRUNED
    out = run_cli("--store", str(store), "reproduce", t.user_attrs["mlflow_run_id"], cwd=PROJECT)
    assert "reproduced: identical" in out.stdout, out.stdout
    _check_clean(store)


@pytest.mark.slow
def test_interrupts_past_max_interrupts_are_not_retried(store):
    """max_interrupts=0: a SIGTERMed trial ends FAIL without a retry copy, its run says why, and
    `study check` does not ask for the retry the bound refused."""
    args = ["n_trials=1", "parallel=1", "trainer.max_epochs=8", "model.sleep=0.03", "log_models=none", "max_interrupts=0"]
    driver = _start(store, *args)
    wait_for_checkpoints(store, 1)
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=60)
    assert driver.returncode == 143, out
    assert "not retried (max_interrupts=0 reached" in out
    client, study = _open(store)
    (t,) = study.get_trials()
    assert t.state == TrialState.FAIL
    assert "not retried (max_interrupts=0 reached" in _run(t, client).data.tags["hpolab.fail_reason"]
    _check_clean(store)
