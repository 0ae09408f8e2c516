"""A driver SIGKILLed after telling Optuna a trial's end (or mid-trial) before its run got the last epochs: the
next driver writes them from the trial's checkpoint (or Optuna) before closing the run
(study/state/metric_backfill.py, repair.py).

The most faithful end-to-end test stops a real `mlflow server` (SIGSTOP) mid-trial, so the upload
thread hangs while the driver's loop tells Optuna the trial COMPLETE, then SIGKILLs the driver. Another
kills a real driver at that point: the trial's model export is slow
(tests/fault_project/experiments/slowexport.py), so the driver has told Optuna COMPLETE and waits
for the model to close the run; SIGKILL then leaves the run RUNNING with last.pt in the trial folder.
Its last batch had reached MLflow already, so the epochs a killed driver never wrote are removed
from mlflow.db by SQL (what an upload thread blocked on a slow MLflow server leaves). The logic tests
use a real embedded MLflow store and a real checkpoint file.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time

import optuna
import pytest
from mlflow import MlflowClient
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, assert_study_check_clean, hpolab_env, metric_steps, open_study, run_cli, start_cli, trial_run
from hpolab.study.state.metric_backfill import TAG, backfill_run
from hpolab.train.checkpoint import save_checkpoint

ARGS = ["experiment=slowexport", "parallel=1", "trainer.max_epochs=4", "log_models=all", "checkpoint_upload_every=0"]


def _trial(values: dict[int, float]):
    return optuna.create_trial(state=TrialState.COMPLETE, value=values[max(values)], params={"h": 1},
                               distributions={"h": CategoricalDistribution([1])}, intermediate_values=values)


def _run_with_epochs(store, steps):
    from mlflow.entities import Metric

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e", artifact_location=str(store / "artifacts"))).info.run_id
    client.log_batch(run_id, metrics=[Metric(k, 0.1 * s, 1000 + s, s) for s in steps for k in ("val_acc", "train_loss")])
    return client, run_id


def test_a_run_missing_its_last_epochs_gets_them_from_last_pt(store, tmp_path):
    client, run_id = _run_with_epochs(store, [1, 2])
    history = [{"epoch": e, "val_acc": 0.1 * e, "train_loss": 1.0 / e} for e in (1, 2, 3, 4)]
    save_checkpoint({"history": history}, tmp_path / "last.pt")
    tags = backfill_run(client, run_id, _trial({1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}), "val_acc", tmp_path, None)
    assert tags == {TAG: "epochs 3-4 from last.pt"}
    for key in ("val_acc", "train_loss"):
        assert metric_steps(client, run_id, key) == [1, 2, 3, 4]
    assert {m.step: m.value for m in client.get_metric_history(run_id, "train_loss")}[4] == 0.25
    assert backfill_run(client, run_id, _trial({1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}), "val_acc", tmp_path, None) == {}


def test_without_a_checkpoint_the_study_metric_comes_from_optuna(store, tmp_path):
    client, run_id = _run_with_epochs(store, [1])
    tags = backfill_run(client, run_id, _trial({1: 0.1, 2: 0.2, 3: 0.3}), "val_acc", tmp_path, f"sqlite:///{store / 'mlflow.db'}")
    assert tags == {TAG: "epochs 2-3 from Optuna"}
    assert {m.step: m.value for m in client.get_metric_history(run_id, "val_acc")} == {1: 0.1, 2: 0.2, 3: 0.3}
    assert metric_steps(client, run_id, "train_loss") == [1]  # only the checkpoint knows the others


def _drop_epochs_after(store, run_id: str, last: int) -> None:
    """What a driver killed before its last batch was written leaves: the run's points up to `last`."""
    with sqlite3.connect(store / "mlflow.db") as db:
        db.execute("DELETE FROM metrics WHERE run_uuid = ? AND step > ?", (run_id, last))
        db.execute("DELETE FROM latest_metrics WHERE run_uuid = ?", (run_id,))
        db.execute("INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
                   "SELECT key, value, timestamp, step, is_nan, run_uuid FROM metrics WHERE run_uuid = ? AND step = ?",
                   (run_id, last))


def _wait_for(path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("repair", ["study run", "study check --repair"])
def test_a_driver_killed_between_tell_and_close_loses_no_epoch(store, tmp_path, repair):
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**hpolab_env(), "HPOLAB_TEST_SLOW_EXPORT_DIR": str(tmp_path), "HPOLAB_TEST_SLOW_EXPORT_S": "30",
           "HPOLAB_TEST_PID_DIR": str(pids), "HPOLAB_METRICS_FLUSH_S": "1000"}
    driver = start_cli("--store", str(store), "study", "run", FAULT_SPEC, *ARGS, "n_trials=1", cwd=FAULT_PROJECT, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(tmp_path / "slow")  # the trial is told COMPLETE; its run waits for the model to close
        client, study = open_study(store)
        (t,) = study.get_trials()
        run_id = t.user_attrs["mlflow_run_id"]
        deadline = time.monotonic() + 30
        while metric_steps(client, run_id, "val_acc") != [1, 2, 3, 4]:  # (the batch is on the upload thread)
            assert time.monotonic() < deadline, metric_steps(client, run_id, "val_acc")
            time.sleep(0.1)
        driver.send_signal(signal.SIGKILL)
        out = driver.communicate(timeout=60)[0]
    finally:
        for p in pids.glob("*.pid"):  # the trial process sleeping in its model's save
            try:
                os.kill(int(p.stem), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert t.state == TrialState.COMPLETE and client.get_run(run_id).info.status == "RUNNING", out
    assert (store / "trials" / "faulty" / f"trial-{t.number}" / "last.pt").is_file()
    _drop_epochs_after(store, run_id, 2)
    assert metric_steps(client, run_id, "val_acc") == [1, 2]

    if repair == "study run":
        out = run_cli("--store", str(store), "study", "run", FAULT_SPEC, *ARGS, "n_trials=2", cwd=FAULT_PROJECT)
    else:
        out = run_cli("--store", str(store), "study", "check", "faulty", "--repair", cwd=FAULT_PROJECT, check=False)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED", out.stdout
    history = client.get_metric_history(run_id, "val_acc")
    assert sorted(m.step for m in history) == [1, 2, 3, 4], out.stdout
    assert run.data.tags.get(TAG) == "epochs 3-4 from last.pt", (run.data.tags, out.stdout)
    assert {m.step: m.value for m in history} == {s: v for s, v in t.intermediate_values.items()}
    for key in run.data.metrics:
        if key != "val_acc" and not key.startswith(("test_", "best_", "system/")):  # (system/: stepped by seconds)
            assert metric_steps(client, run_id, key) == [1, 2, 3, 4], key
    assert_study_check_clean(store, "faulty")
    if repair == "study run":
        _, study = open_study(store)
        assert trial_run(study.get_trials()[1], client).info.status == "FINISHED"


@pytest.mark.slow
def test_a_reaped_attempt_s_run_gets_the_epochs_its_killed_driver_never_wrote(store):
    """SIGKILL mid-trial with metric batches that are never due: the dead attempt's run has none of
    its epochs; the next driver reaps it and writes them (last.pt, Optuna) before closing it FAILED."""
    env = {**hpolab_env(), "HPOLAB_METRICS_FLUSH_S": "1000"}
    args = ["parallel=1", "trainer.max_epochs=4", "model.sleep=0.1", "checkpoint_upload_every=1000", "n_trials=1"]
    driver = start_cli("--store", str(store), "study", "run", FAULT_SPEC, *args, cwd=FAULT_PROJECT, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while True:  # two epochs told to Optuna (and in last.pt), none written to MLflow
        assert time.monotonic() < deadline and driver.poll() is None, "the trial never reached its second epoch"
        try:
            (t,) = open_study(store)[1].get_trials()
            if len(t.intermediate_values) >= 2:
                break
        except Exception:  # (the study is not there yet)
            pass
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=60)
    time.sleep(1)  # the orphaned trial process notices its driver is gone
    client, study = open_study(store)
    dead = study.get_trials()[0]
    run_id = dead.user_attrs["mlflow_run_id"]
    assert metric_steps(client, run_id, "val_acc") == []

    out = run_cli("--store", str(store), "study", "run", FAULT_SPEC, *args, cwd=FAULT_PROJECT)
    run = client.get_run(run_id)
    assert run.info.status == "FAILED", out.stdout
    steps = metric_steps(client, run_id, "val_acc")
    assert steps and steps == list(range(1, max(steps) + 1)) and set(dead.intermediate_values) <= set(steps), (steps, out.stdout)
    assert run.data.tags.get(TAG, "").startswith("epochs 1-"), run.data.tags
    assert metric_steps(client, run_id, "train_loss") == steps
    assert_study_check_clean(store, "faulty")


@pytest.fixture()
def stoppable_mlflow_server(tmp_path):
    """`mlflow server` in a process group of its own (SIGSTOP/SIGCONT reach all its processes)."""
    import sys

    from services import free_port, wait_for_http

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", (tmp_path / "server-artifacts").as_uri(), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**hpolab_env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{url}/health", proc)
        yield url, proc
    finally:
        os.killpg(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _wait_for_trial(store, done, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            trials = open_study(store)[1].get_trials()
            if trials and done(trials[0]):
                return trials[0]
        except Exception:  # (the study is not there yet)
            pass
        time.sleep(0.05)
    raise AssertionError("the trial never got there")


@pytest.mark.slow
def test_a_driver_killed_while_its_mlflow_server_hangs_after_the_tell_loses_no_epoch(store, stoppable_mlflow_server):
    """The real kill point: the MLflow server stops answering (SIGSTOP) mid-trial, so the upload
    thread hangs on one request with the rest of the run's epochs queued behind it; the driver's loop
    still tells Optuna the trial COMPLETE; then the driver is SIGKILLed and the server resumes."""
    url, server = stoppable_mlflow_server
    env = {**hpolab_env(), "MLFLOW_TRACKING_URI": url, "HPOLAB_METRICS_FLUSH_S": "1000"}
    args = ["parallel=1", "trainer.max_epochs=4", "model.sleep=0.1", "checkpoint_upload_every=0", "log_models=none"]
    driver = start_cli("--store", str(store), "study", "run", FAULT_SPEC, *args, "n_trials=1", cwd=FAULT_PROJECT, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_trial(store, lambda t: len(t.intermediate_values) >= 1)
        os.killpg(server.pid, signal.SIGSTOP)
        t = _wait_for_trial(store, lambda t: t.state == TrialState.COMPLETE)
    finally:
        driver.send_signal(signal.SIGKILL)
        out = driver.communicate(timeout=60)[0]
        os.killpg(server.pid, signal.SIGCONT)
    client = MlflowClient(url)
    run_id = t.user_attrs["mlflow_run_id"]
    time.sleep(1)  # (the one request the server had received when it stopped)
    assert client.get_run(run_id).info.status == "RUNNING", out
    lost = metric_steps(client, run_id, "val_acc")
    assert 4 not in lost, lost  # what the killed driver left: its last epochs never reached MLflow

    out = run_cli("--store", str(store), "study", "run", FAULT_SPEC, *args, "n_trials=2", cwd=FAULT_PROJECT, env=env)
    run = client.get_run(run_id)
    assert metric_steps(client, run_id, "val_acc") == [1, 2, 3, 4], (lost, out.stdout)
    assert run.info.status == "FINISHED" and run.data.tags[TAG].endswith("from last.pt"), run.data.tags
    assert metric_steps(client, run_id, "train_loss") == [1, 2, 3, 4]
    check = run_cli("--store", str(store), "study", "check", "faulty", cwd=FAULT_PROJECT, env=env, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
