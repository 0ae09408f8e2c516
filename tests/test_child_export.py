"""A trial's model saved by its own process (study/trials/child_export.py), logged by the driver.

Real processes and pipes (a fork of this one), a real checkpoint of the digits CNN, a real SQLite
MLflow store: the trial process saves the model when the driver says "export", the driver logs that
folder (stores/models.log_saved_model) as the run's model, and MLflow loads it back by its URI.
When the process cannot save it (it died, or its save failed), the driver is told why and gets None
(the tracker then exports from the checkpoint itself).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from hpolab.study.trials import child_export
from hpolab.study.trials.lifeline import ORPHAN_EXIT_CODE

MODEL = {"channels": 8, "depth": 1, "dropout": 0.0}


@pytest.fixture(autouse=True)
def _no_ambient_tracking_uri():
    import mlflow

    mlflow.set_tracking_uri(None)
    yield
    mlflow.set_tracking_uri(None)
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # (set_tracking_uri exports it: CLI calls of later tests inherit it)


def _trial(tmp_path: Path, checkpoint: Path | None = None):
    """A job and "done" summary as a digits trial process has them, with a real best.pt."""
    from experiments import digits_cnn
    from hpolab.train.checkpoint import CHECKPOINT_FORMAT

    torch.manual_seed(0)
    model = digits_cnn.build_model(MODEL, (1, 8, 8), 10).eval()
    best = tmp_path / "best.pt"
    torch.save({"format_version": CHECKPOINT_FORMAT, "state": {"model": model.state_dict()}}, best)  # (checkpoint.py's layout)
    example = torch.randn(2, 1, 8, 8)
    with torch.inference_mode():
        output = model(example)
    job = {"experiment": "digits_cnn", "config": {"model": MODEL}, "checkpoint_dir": str(tmp_path), "export_model": True}
    summary = {"input_shape": [1, 8, 8], "num_classes": 10, "best_checkpoint": str(checkpoint or best), "last_checkpoint": None,
               "input_example": example.numpy(), "output_example": output.numpy()}
    return job, summary


def _after_done(conn, lifeline, job, summary) -> None:
    """The trial process after it sent "done" (trial_process.run): wait for the driver, save if told."""
    from hpolab.study.trials.lifeline import watch_lifeline

    watch_lifeline(lifeline)

    def save(folder):  # the model rebuilt from its checkpoint, as the driver rebuilds it (stores/models.py)
        from hpolab.config.experiment import load_experiment
        from hpolab.stores.models import model_from_checkpoint

        model = model_from_checkpoint(load_experiment(job["experiment"]), job["config"], summary)
        return child_export.save_model_folder(model, folder, summary["input_example"], summary["output_example"])

    child_export.offer_export(conn, job, summary, save)
    conn.close()


def _start(job, summary):
    """A process running _after_done with its pipe and lifeline. Forked from a forkserver, as trials
    are (a fork of this multi-threaded test process could deadlock in torch)."""
    ctx = mp.get_context("forkserver")
    parent, child = ctx.Pipe(duplex=True)
    life_read, life_write = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_after_done, args=(child, life_read, job, summary))
    proc.start()
    child.close()
    life_read.close()
    return proc, parent, life_write


@pytest.mark.slow
def test_the_trial_process_saves_its_model_and_the_driver_logs_that_folder(tmp_path, store):
    import mlflow

    from hpolab.stores.models import log_saved_model

    job, summary = _trial(tmp_path)
    proc, conn, lifeline = _start(job, summary)
    handles = child_export.answer_child(conn, lifeline, export=True)
    problems: list[str] = []
    saved = child_export.receive_model(*handles, on_problem=problems.append)
    proc.join(30)
    # it exits after sending the path, or its lifeline (closed by receive_model) ends it first
    assert problems == [] and proc.exitcode in (0, ORPHAN_EXIT_CODE)
    assert saved == str(tmp_path / child_export.MODEL_DIR) and (Path(saved) / "MLmodel").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model-")]  # no half-written folder left

    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("child-export", artifact_location=str(store / "artifacts"))
    run = client.create_run(exp)
    mlflow.set_tracking_uri(uri)
    tags = log_saved_model(saved, run.info.run_id)

    model = client.get_logged_model(tags["hpolab.model_id"])
    assert model.experiment_id == exp and model.source_run_id == run.info.run_id  # the study's experiment, not Default
    assert str(model.status) in ("READY", "LoggedModelStatus.READY")
    assert [o.model_id for o in client.get_run(run.info.run_id).outputs.model_outputs] == [model.model_id]
    assert Path(model.artifact_location.removeprefix("file://")).is_relative_to(store / "artifacts")
    loaded = mlflow.pyfunc.load_model(tags["hpolab.model_uri"])
    assert loaded.metadata.model_id == model.model_id and loaded.metadata.run_id == run.info.run_id
    assert loaded.metadata.get_input_schema() is not None  # signature kept from the saved folder
    assert (Path(model.artifact_location.removeprefix("file://")) / "data" / "model.pt2").is_file()  # torch.export's format
    np.testing.assert_allclose(np.asarray(loaded.predict(summary["input_example"])), summary["output_example"], atol=1e-5)


def test_told_to_skip_the_trial_process_saves_nothing_and_exits(tmp_path):
    job, summary = _trial(tmp_path)
    proc, conn, lifeline = _start(job, summary)
    assert child_export.answer_child(conn, lifeline, export=False) is None
    proc.join(30)
    # it exits on "skip", or its lifeline (closed with it) ends it first
    assert proc.exitcode in (0, ORPHAN_EXIT_CODE) and not (tmp_path / child_export.MODEL_DIR).exists()


def test_a_save_that_fails_in_the_trial_process_is_reported_to_the_driver(tmp_path):
    job, summary = _trial(tmp_path, checkpoint=tmp_path / "missing.pt")
    proc, conn, lifeline = _start(job, summary)
    problems: list[str] = []
    assert child_export.receive_model(*child_export.answer_child(conn, lifeline, export=True), on_problem=problems.append) is None
    proc.join(30)
    assert len(problems) == 1 and "could not save the model (FileNotFoundError: checkpoint not found" in problems[0]
    assert "exporting it from its checkpoint here" in problems[0]


def test_a_trial_process_that_dies_before_saving_is_noticed_at_once(tmp_path):
    job, summary = _trial(tmp_path)
    proc, conn, lifeline = _start(job, summary)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    problems: list[str] = []
    handles = child_export.answer_child(conn, lifeline, export=True)
    saved = child_export.receive_model(*handles, on_problem=problems.append) if handles else None
    assert saved is None
    assert handles is None or problems == ["its process ended before saving the model; exporting it from its checkpoint here"]


def test_a_driver_that_waits_too_long_gives_up_with_a_reason(tmp_path):
    ctx = mp.get_context("fork")
    conn, silent = ctx.Pipe(duplex=True)  # a process that never answers
    life_read, life_write = ctx.Pipe(duplex=False)
    problems: list[str] = []
    assert child_export.receive_model(conn, life_write, on_problem=problems.append, wait_s=0.2) is None
    assert problems == ["its process did not save the model within 0.2 s; exporting it from its checkpoint here"]
    assert life_read.poll(0) and _closed(life_read)  # its lifeline closed: the process ends


def _closed(read_end) -> bool:
    try:
        read_end.recv()
    except EOFError:
        return True
    return False


WARMED_FORKSERVER = r"""
import importlib.util, os, sys, time
import torch
if os.environ.get("MLFLOW_FIRST"):  # as the command imports it before forking its server (trial_forkserver.start)
    import mlflow
    from mlflow.telemetry import get_telemetry_client
    assert get_telemetry_client() is not None, "telemetry is off already: nothing would be proved"
import hpolab.study.trials.trial_process  # what the forkserver preloads first (torch, the routine)
threads_before = len(os.listdir("/proc/self/task"))
import hpolab.study.trials.export_warm  # noqa: F401  (the warm-up runs on import)
assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
from mlflow.telemetry import get_telemetry_client
assert get_telemetry_client() is None, "the forkserver kept a telemetry client"
pid = os.fork()  # as the forkserver forks a trial
if pid == 0:
    torch.set_num_threads(2)
    x = torch.randn(512, 512)
    for _ in range(20):
        x = (x @ x).tanh() + x.clone()  # parallel kernels: a libgomp pool copied by the fork would hang here
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), "threads", threads_before, len(os.listdir("/proc/self/task")))
if importlib.util.find_spec("pytorch_lightning"):  # installed (the test extras), and not imported by the warm-up
    print("pytorch_lightning imported:", "pytorch_lightning" in sys.modules)
    from mlflow.pytorch._lightning_autolog import MlflowModelCheckpointCallback  # still importable on request
"""


MLFLOW_TELEMETRY_OFF = ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS")  # (and other CI names)


@pytest.mark.slow
@pytest.mark.parametrize("mlflow_first", [False, True], ids=["mlflow-imported-by-the-warm-up", "mlflow-imported-before-the-fork"])
def test_the_warmed_forkserver_forks_trials_that_compute_in_parallel(tmp_path, mlflow_first):
    """The warm-up runs torch on one thread and MLflow without telemetry: no thread it would start
    (an OpenMP pool, a telemetry client) exists in the forkserver, so a forked trial computing on two
    threads does not hang (it did, in the first version of this change). Also when MLflow was imported
    before, with telemetry on (a user's default; the test process's own variables would turn it off).
    Lightning, when installed, is not imported by the warm-up (mlflow.pytorch would import it)."""
    import importlib.util
    import subprocess
    import sys

    from conftest import ROOT, hpolab_env

    env = {k: v for k, v in hpolab_env().items() if k not in MLFLOW_TELEMETRY_OFF}
    env["PYTHONPATH"] = str(ROOT / "platform")
    if mlflow_first:
        env["MLFLOW_FIRST"] = "1"
    out = subprocess.run([sys.executable, "-c", WARMED_FORKSERVER], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    words = out.stdout.split()
    assert words[:2] == ["child", "0"], out.stdout
    assert int(words[4]) <= int(words[3]) + 1, out.stdout  # at most MLflow's own import-time thread, no pool
    if importlib.util.find_spec("pytorch_lightning"):  # (3-4 s of CPU before every study's first trial)
        assert "pytorch_lightning imported: False" in out.stdout, out.stdout


@pytest.mark.slow
def test_sigterm_while_trials_save_their_models_loses_no_model(tmp_path):
    """The real CLI with the default `log_models`: SIGTERM once the third trial started (the second one's
    model is still being saved; sent earlier, it could come while the driver claims that trial, which
    then stays claimed for the next run: `study check` lists it). The driver
    exits 143; every trial that completed has its model (saved by its own process: no fallback
    note), MLflow loads it, no saved folder is left in the trial folders, and both stores agree."""
    import subprocess
    import time

    import mlflow
    import optuna
    from optuna.trial import TrialState

    from conftest import ROOT, run_cli, start_cli

    store = tmp_path / "store"
    driver = start_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", "name=sigterm-models",
                       "n_trials=6", "parallel=1", "trainer.max_epochs=3", "pruner={type: none}",
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    seen = ""
    while "trial 2 started" not in seen and time.monotonic() < deadline and driver.poll() is None:
        seen += driver.stdout.readline()
    driver.send_signal(signal.SIGTERM)
    out = seen + driver.communicate(timeout=300)[0]
    assert driver.returncode == 143, out
    assert "exporting it from its checkpoint" not in out and "logging the model failed" not in out, out

    study = optuna.load_study(study_name="sigterm-models", storage=f"sqlite:///{store / 'optuna.db'}")
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(complete) >= 2, out
    client = mlflow.MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    for t in complete:  # 2..5 COMPLETE trials: all within the default top 5, so each has its model
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.info.status == "FINISHED"
        model = client.get_logged_model(run.data.tags["hpolab.model_id"])
        assert model.source_run_id == run.info.run_id and (Path(model.artifact_location.removeprefix("file://")) / "MLmodel").is_file()
    left = [p for p in (store / "trials").rglob("*") if p.name == child_export.MODEL_DIR or p.name.startswith(".model-")]
    assert left == []
    check = run_cli("--store", str(store), "study", "check", "sigterm-models")
    assert "agree" in check.stdout, check.stdout
