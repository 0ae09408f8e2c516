"""Checkpoints travel through the MLflow artifact store: no shared filesystem needed.

Two workers share the Optuna and MLflow databases (SQLite on this host, standing in for PostgreSQL and
an MLflow server) but each keeps its own `--store`, so worker 2 cannot see worker 1's trial folders.
Worker 1 is SIGKILLed mid-trial after its checkpoint was uploaded; worker 2 retries the trial and must
resume it from the uploaded checkpoint at the right epoch.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import torch
from mlflow import MlflowClient
from optuna.trial import TrialState

from conftest import run_cli, start_cli

PROJECT = Path(__file__).parent / "fault_project"
SPEC = "studies/faulty.yaml"
# ~12 forward calls per epoch x 0.1 s: epochs of about 1.2 s, six of them
ARGS = ["n_trials=1", "parallel=1", "trainer.max_epochs=6", "model.sleep=0.1", "checkpoint_upload_every=0", "log_models=none"]


def _global(shared: Path, store: Path) -> list[str]:
    return ["--store", str(store), "--storage", f"sqlite:///{shared / 'optuna.db'}",
            "--tracking-uri", f"sqlite:///{shared / 'mlflow.db'}"]


def _uploaded_run(shared: Path, timeout: float = 600) -> str:
    """The run id of trial 0 once its checkpoints/last.pt is in the artifact store."""
    client = MlflowClient(tracking_uri=f"sqlite:///{shared / 'mlflow.db'}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            study = optuna.load_study(study_name="faulty", storage=f"sqlite:///{shared / 'optuna.db'}")
            run_id = study.get_trials()[0].user_attrs.get("mlflow_run_id")
            if run_id and "checkpoints/last.pt" in [a.path for a in client.list_artifacts(run_id, "checkpoints")]:
                return run_id
        except (KeyError, IndexError):
            pass
        time.sleep(0.1)
    raise AssertionError("trial 0 uploaded no checkpoint in time")


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc: children of children)."""
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = [], [pid]
    while frontier:
        frontier = [p for p, pp in parents.items() if pp in frontier]
        found += frontier
    return found


def _wait_gone(pids: list[int], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and "(Z)" not in _state(p)]
        if not alive:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes {alive} of the killed worker still run after {timeout:g} s")


def _state(pid: int) -> str:
    try:
        return "(Z)" if (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z" else ""
    except (OSError, IndexError):
        return ""


@pytest.mark.slow
def test_a_retry_on_another_worker_resumes_from_the_uploaded_checkpoint(tmp_path, migrated_store):
    shared, w1, w2 = tmp_path / "shared", tmp_path / "w1", tmp_path / "w2"
    for d in (shared, w1, w2):
        d.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, shared / name)
    worker1 = start_cli(*_global(shared, w1), "study", "run", SPEC, *ARGS, cwd=PROJECT,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        dead_run = _uploaded_run(shared)
        family = _descendants(worker1.pid)  # its forkserver and trial process
    finally:
        worker1.kill()  # SIGKILL: no chance to upload anything more
        worker1.communicate(timeout=30)
    _wait_gone(family)  # its trial process ends on its own (lifeline): wait for that, not for a guess

    client = MlflowClient(tracking_uri=f"sqlite:///{shared / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("faulty")
    assert experiment.artifact_location.startswith((shared / "artifacts").as_uri()), experiment.artifact_location
    got = Path(client.download_artifacts(dead_run, "checkpoints/last.pt", str(tmp_path)))
    uploaded_epoch = int(torch.load(got, weights_only=True)["epoch"])
    print(f"uploaded epoch at the kill: {uploaded_epoch}")
    assert 1 <= uploaded_epoch < 6, "killed after the trial ended: make its epochs slower"
    assert (w1 / "trials" / "faulty" / "trial-0" / "last.pt").exists()  # the dead attempt's, where worker 2 cannot look

    out = run_cli(*_global(shared, w2), "study", "run", SPEC, *ARGS, cwd=PROJECT)
    assert "is gone; retried as trial 1" in out.stdout, out.stdout
    study = optuna.load_study(study_name="faulty", storage=f"sqlite:///{shared / 'optuna.db'}")
    dead, retry = study.get_trials()
    assert dead.state == TrialState.FAIL and retry.state == TrialState.COMPLETE, out.stdout
    run = client.get_run(retry.user_attrs["mlflow_run_id"])
    tags = run.data.tags
    assert tags["hpolab.retry_of_run"] == dead_run
    assert tags["hpolab.resume_source"] == "artifact"
    assert tags["hpolab.resumed_from"] == f"runs:/{dead_run}/checkpoints/last.pt"
    assert tags["hpolab.resumed_after_epoch"] == str(uploaded_epoch)
    assert not (w2 / "trials" / "faulty" / "trial-0").exists()

    # One continuous curve 1..6, each epoch once: epochs 1..k carried over from the checkpoint before
    # the retry trained, then its own epochs k+1..6 (a retry that re-trained from scratch would log
    # epochs 1..k twice).
    history = sorted(client.get_metric_history(run.info.run_id, "val_acc"), key=lambda m: (m.timestamp, m.step))
    assert sorted(m.step for m in history) == list(range(1, 7)), [(m.step, m.timestamp) for m in history]
    carried = [m.timestamp for m in history if m.step <= uploaded_epoch]
    own = [m.timestamp for m in history if m.step > uploaded_epoch]
    assert max(carried) <= min(own), (uploaded_epoch, [(m.step, m.timestamp) for m in history])
    assert [m.step for m in history] == list(range(1, 7))  # in order of logging, too
    # Its own checkpoint was uploaded as it ran, and the dead attempt's run is closed.
    assert tags["hpolab.checkpoint_epoch"] == "6"
    assert client.get_run(dead_run).info.status == "FAILED"
