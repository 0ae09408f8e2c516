"""Through Optuna's gRPC storage proxy (no Optuna heartbeats), a worker that dies on another host is
reaped by the others: its hpolab heartbeat attr stops changing (study/driver/heartbeat.py, AttrBeats).

The "other host" is faked with HPOLAB_TEST_HOSTNAME (study/state/owners.py): worker A's owner records
name a host that is not this one, so worker B cannot see A's pid is gone and must rely on the
heartbeat, as it would for a worker on another machine. Before the fix B waited for A's trial forever.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, run_cli, start_cli, storage_proxy, trial_run

pytestmark = pytest.mark.slow
ARGS = ["n_trials=2", "parallel=1", "trainer.max_epochs=8", "model.sleep=0.03", "log_models=none"]
HANG_LIMIT = 300  # seconds: far past B's own work (about a minute); reached only if B waits for A forever


def _wait_for_running_checkpoint(store: Path, database: str, timeout: float = 180) -> int:
    """The number of A's RUNNING trial once it has written a checkpoint."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            trials = optuna.load_study(study_name="faulty", storage=database).get_trials()
        except KeyError:
            trials = []
        for t in trials:
            if t.state == TrialState.RUNNING and (store / "trials" / "faulty" / f"trial-{t.number}" / "last.pt").exists():
                return t.number
        time.sleep(0.3)
    raise AssertionError("worker A never had a trial RUNNING with a checkpoint")


def test_a_worker_dead_on_another_host_is_reaped_through_the_proxy(store, tmp_path):
    database = f"sqlite:///{store / 'optuna.db'}"
    with storage_proxy(database, tmp_path) as grpc:
        env = {**hpolab_env(), "OPTUNA_STORAGE": grpc, "HPOLAB_HEARTBEAT_INTERVAL": "1", "HPOLAB_GRACE_PERIOD": "4"}
        cmd = ["--store", str(store), "worker", FAULT_SPEC, *ARGS]
        a = start_cli(*cmd, cwd=FAULT_PROJECT, env={**env, "HPOLAB_TEST_HOSTNAME": "elsewhere.example"},
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            dead = _wait_for_running_checkpoint(store, database)
        finally:
            os.killpg(a.pid, signal.SIGKILL)  # A, its forkserver and its trials: no cleanup runs
            a.communicate(timeout=120)
        trial = optuna.load_study(study_name="faulty", storage=database).trials[dead]
        assert trial.state == TrialState.RUNNING and trial.user_attrs["hpolab.owner"]["host"] == "elsewhere.example"
        assert "hpolab.heartbeat" in trial.system_attrs  # A beat through the proxy

        b = start_cli(*cmd, cwd=FAULT_PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out = b.communicate(timeout=HANG_LIMIT)[0]
        except subprocess.TimeoutExpired:
            b.kill()
            out = b.communicate(timeout=120)[0]
            raise AssertionError(f"worker B hung for {HANG_LIMIT} s waiting for the dead worker's trial:\n{out}") from None
        assert b.returncode == 0, out
        check = run_cli("--store", str(store), "--storage", grpc, "study", "check", "faulty", cwd=FAULT_PROJECT, check=False)
        assert check.returncode == 0, check.stdout + check.stderr

    study = optuna.load_study(study_name="faulty", storage=database)
    trials = study.get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)], [t.state for t in trials]
    assert trials[dead].state == TrialState.FAIL
    (retry,) = [t for t in trials if t.system_attrs.get("retry_history", [None])[-1] == dead]
    assert retry.system_attrs["hpolab.retry_kinds"][-1] == "stale"  # free: does not use up max_retries
    finished = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(finished) == 2, [(t.number, t.state) for t in trials]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    dead_run = trial_run(trials[dead], client)
    assert dead_run.info.status == "FAILED"
    assert "stopped sending heartbeats" in dead_run.data.tags["hpolab.fail_reason"]
    assert "elsewhere.example" in dead_run.data.tags["hpolab.fail_reason"]
