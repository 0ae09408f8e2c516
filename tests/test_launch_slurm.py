"""`hpolab launch slurm` on a real single-node Slurm (scripts/slurm-local): the real sbatch, 2 array
tasks sharing one study, the exact budget, the Slurm tags on every trial run, and scancel leaving a
resumable study that a second launch completes.

Skipped, with the reason, where Slurm is not installed (scripts/system-deps installs it). When Slurm
is installed but not running and the tests run as root, the module starts it and stops it after.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, ROOT, hpolab_env, open_study, run_cli, trial_run
from services import HAVE_POSTGRES, free_port, postgres_cluster, wait_for_http

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("sbatch") is None,
                                 reason="Slurm is not installed (sudo scripts/system-deps installs slurmctld, slurmd, slurm-client, munge)")]

TINY = ["parallel=1", "trainer.max_epochs=2", "sampler={type: random}", "log_models=none"]


def _slurm_answers() -> bool:
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and any(s.startswith(("idle", "mixed", "alloc")) for s in out.stdout.split())


@pytest.fixture(scope="module")
def slurm():
    started = False
    if not _slurm_answers():
        if os.geteuid() != 0:
            pytest.skip("Slurm is installed but not running: sudo scripts/slurm-local start")
        subprocess.run([str(ROOT / "scripts" / "slurm-local"), "start"], check=True, timeout=300)
        started = True
    yield
    if started:
        subprocess.run([str(ROOT / "scripts" / "slurm-local"), "stop"], timeout=300)


def _launch(store: Path, logs: Path, *args: str) -> str:
    out = run_cli("--store", str(store), "launch", "slurm", FAULT_SPEC, *args, "--workers", "2", "--single-node",
                  "--log-dir", str(logs), cwd=FAULT_PROJECT).stdout
    m = re.search(r"submitted Slurm job (\d+)", out)
    assert m, out
    assert f"squeue -j {m[1]}" in out and f"scancel {m[1]}" in out and "study status" in out
    return m[1]


def _in_queue(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True, timeout=60)
    return out.returncode == 0 and bool(out.stdout.strip())


def _wait_until(condition, what: str, ceiling: float = 600) -> None:
    deadline = time.monotonic() + ceiling
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {ceiling:.0f} s")


def _logs(logs: Path, job_id: str) -> str:
    return "\n".join(p.read_text() for p in sorted(logs.glob(f"*-{job_id}_*.out")))


def test_two_array_tasks_share_the_budget_and_tag_their_runs(slurm, store, tmp_path):
    logs = tmp_path / "logs"
    job = _launch(store, logs, "name=slurm-a", "n_trials=4", *TINY)
    _wait_until(lambda: not _in_queue(job), f"Slurm job {job} to finish")
    client, study = open_study(store, "slurm-a")
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4, _logs(logs, job)  # exactly the budget
    node = socket.gethostname().split(".")[0]
    seeds: dict[str, set[str]] = {}
    for t in trials:
        tags = trial_run(t, client).data.tags
        assert tags["env.slurm_array_job_id"] == job
        assert tags["env.slurm_array_task_id"] in ("0", "1")
        assert tags["env.slurm_job_id"].isdigit() and tags["env.slurm_node"] == node
        seeds.setdefault(tags["env.slurm_array_task_id"], set()).add(tags["hpolab.worker_seed"])
        assert str(t.user_attrs["worker_seed"]) == tags["hpolab.worker_seed"]
    assert all(len(s) == 1 for s in seeds.values())
    if len(seeds) == 2:  # both workers ran trials (the usual case): each had its own sampler salt
        assert seeds["0"] != seeds["1"]


def test_scancel_leaves_a_resumable_study_and_a_relaunch_completes_it(slurm, store, tmp_path):
    logs = tmp_path / "logs"
    args = ["name=slurm-b", "n_trials=2", "parallel=1", "trainer.max_epochs=20", "model.sleep=0.03",
            "sampler={type: random}", "log_models=none"]
    job = _launch(store, logs, *args)
    trial_dirs = store / "trials" / "slurm-b"
    _wait_until(lambda: len(list(trial_dirs.glob("trial-*/last.pt"))) >= 2, "both workers to checkpoint a trial")
    subprocess.run(["scancel", job], check=True, timeout=60)
    _wait_until(lambda: not _in_queue(job), f"cancelled job {job} to leave the queue", ceiling=300)
    text = _logs(logs, job)
    assert text.count("SIGTERM: starting no new trials") == 2, text  # exec: each worker got the signal itself
    client, study = open_study(store, "slurm-b")
    trials = study.get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING], text
    stopped = [t for t in trials if t.state == TrialState.FAIL]
    states = [(t.number, t.state.name, t.system_attrs) for t in trials]
    assert stopped and len([t for t in trials if t.state == TrialState.WAITING]) == len(stopped), (states, text)  # queued to resume

    again = _launch(store, logs, *args)
    _wait_until(lambda: not _in_queue(again), f"Slurm job {again} to finish")
    client, study = open_study(store, "slurm-b")
    trials = study.get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)], _logs(logs, again)
    assert len([t for t in trials if t.state == TrialState.COMPLETE]) == 2
    resumed = [t for t in trials if t.system_attrs.get("retry_history")]
    assert resumed and all(trial_run(t, client).data.tags["env.slurm_array_job_id"] == again for t in resumed)


# A PostgreSQL password of awkward shapes ("/", "+", "=", "?", "#", ":" unencoded; "@" encoded in the URL)
# and an MLflow server that refuses anonymous clients: both secrets live only in the project's .env.
PG_PASSWORD, MLFLOW_ADMIN, MLFLOW_PASSWORD = "c2Vj/Qm?Hs#:+x==@1", "hpolab-admin", "mlflow-Pa55-for-tests"


@contextmanager
def _basic_auth_mlflow(tmp: Path, mlflow_db: Path):
    """`mlflow server --app-name basic-auth` (as tests/test_mlflow_auth.py runs it): its URL."""
    shutil.copy(mlflow_db, tmp / "mlflow.db")
    (tmp / "auth.ini").write_text("[mlflow]\ndefault_permission = READ\n"
                                  f"database_uri = sqlite:///{tmp / 'auth.db'}\n"
                                  "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                                  "auth_cache_ttl_seconds = 300\n")
    port = free_port()
    env = {**hpolab_env(), "MLFLOW_AUTH_CONFIG_PATH": str(tmp / "auth.ini"), "MLFLOW_AUTH_ADMIN_USERNAME": MLFLOW_ADMIN,
           "MLFLOW_AUTH_ADMIN_PASSWORD": MLFLOW_PASSWORD, "MLFLOW_FLASK_SERVER_SECRET_KEY": "csrf-key-for-tests-only",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth",
                             "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}", "--artifacts-destination",
                             (tmp / "artifacts").as_uri(), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.skipif(not HAVE_POSTGRES, reason="PostgreSQL server binaries not installed (run scripts/system-deps)")
def test_stores_and_credentials_from_dotenv_reach_the_jobs_and_no_secret_is_kept(slurm, migrated_store, tmp_path, monkeypatch):
    """A project whose .env names a PostgreSQL with a password and an MLflow server with basic auth:
    the jobs get both (the study completes, its runs are on the server), the follow-up command names
    those stores, and neither secret is in anything printed or kept (the script, the task logs)."""
    import optuna
    from mlflow import MlflowClient

    project, logs = tmp_path / "project", tmp_path / "logs"
    shutil.copytree(FAULT_PROJECT, project)
    (tmp_path / "mlflow").mkdir()
    with postgres_cluster(user="hpolab", password=PG_PASSWORD) as (_, pg_port, _data), \
            _basic_auth_mlflow(tmp_path / "mlflow", migrated_store / "mlflow.db") as mlflow_url:
        pg_url = f"postgresql+psycopg2://hpolab:{PG_PASSWORD.replace('@', '%40')}@127.0.0.1:{pg_port}/postgres"
        (project / ".env").write_text(f"OPTUNA_STORAGE='{pg_url}'\nMLFLOW_TRACKING_URI={mlflow_url}\n"
                                      f"MLFLOW_TRACKING_USERNAME={MLFLOW_ADMIN}\nMLFLOW_TRACKING_PASSWORD={MLFLOW_PASSWORD}\n")
        out = run_cli("--store", str(tmp_path / "st"), "launch", "slurm", FAULT_SPEC, "name=slurm-env", "n_trials=2", *TINY,
                      "--workers", "1", "--log-dir", str(logs), cwd=project, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        job = re.search(r"submitted Slurm job (\d+)", out.stdout)[1]
        assert f'--storage "$OPTUNA_STORAGE" --tracking-uri {mlflow_url} study status slurm-env' in out.stdout
        assert "hpolab:***@127.0.0.1" in out.stdout  # which database "$OPTUNA_STORAGE" is
        _wait_until(lambda: not _in_queue(job), f"Slurm job {job} to finish")
        study = optuna.load_study(study_name="slurm-env", storage=pg_url)
        assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 2, _logs(logs, job)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", MLFLOW_ADMIN)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", MLFLOW_PASSWORD)
        client = MlflowClient(tracking_uri=mlflow_url)
        runs = client.search_runs([client.get_experiment_by_name("slurm-env").experiment_id])
        assert len(runs) == 3  # the parent and two trials, written by the job with the .env credentials
        records = "\n".join(f"{k}={v}" for r in runs for k, v in (*r.data.params.items(), *r.data.tags.items()))
    kept = out.stdout + out.stderr + records + "".join(p.read_text(errors="replace") for p in logs.rglob("*") if p.is_file())
    assert (logs / "hpolab-slurm-env.sbatch").is_file()
    for secret in (PG_PASSWORD, PG_PASSWORD.replace("@", "%40"), "c2Vj/Qm", MLFLOW_PASSWORD):
        assert secret not in kept, secret
