"""Scale-out without changing the spec: PostgreSQL (Optuna), a real `mlflow server`, four workers.

Real PostgreSQL from Debian's package (`scripts/system-deps` installs it; CI runs that first): a
throw-away cluster in a temp folder on a free port, run as the `postgres` user (PostgreSQL refuses
to run as root). Skipped, with the reason, where the binaries are missing.
"""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from conftest import ROOT, hpolab_env, run_cli, start_cli, storage_proxy
from services import HAVE_POSTGRES, NO_POSTGRES, as_postgres, free_port, postgres_cluster, wait_for_http

pytestmark = pytest.mark.skipif(not HAVE_POSTGRES, reason=NO_POSTGRES)


@pytest.fixture(scope="module")
def postgres():
    with postgres_cluster() as (bin_dir, port, data):
        for db in ("optuna", "mlflow"):
            as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", db)
        yield f"postgres@127.0.0.1:{port}"


@pytest.fixture(scope="module")
def mlflow_server(postgres, tmp_path_factory):
    port = free_port()
    artifacts = tmp_path_factory.mktemp("server-artifacts")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"postgresql+psycopg2://{postgres}/mlflow",
         "--artifacts-destination", artifacts.as_uri(), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**hpolab_env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # as compose and the k8s manifests run it
    )
    url = f"http://127.0.0.1:{port}"
    wait_for_http(f"{url}/health", proc)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_four_workers_share_one_study_on_postgres_and_an_mlflow_server(postgres, mlflow_server, tmp_path):
    storage = f"postgresql+psycopg2://{postgres}/optuna"
    env = {**hpolab_env(), "OPTUNA_STORAGE": storage, "MLFLOW_TRACKING_URI": mlflow_server}
    args = ["studies/digits_cnn.yaml", "n_trials=4", "parallel=1", "trainer.max_epochs=2", "pruner={type: none}"]
    n_workers = 4  # more workers than a 2-core machine has cores: they start (and ask) together
    workers = [
        start_cli("--store", str(tmp_path / f"local{i}"), "worker", *args, cwd=ROOT, env=env,
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(n_workers)
    ]
    outs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0] * n_workers, outs

    study = optuna.load_study(study_name="digits-cnn", storage=storage)
    trials = study.get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    # Each worker counts and asks under a PostgreSQL advisory lock: exactly the budget, never one more.
    assert len(complete) == 4 and len(trials) == 4
    worked = [o for o in outs if "trial" in o and "started" in o]
    assert len(worked) >= 2, outs  # the trials were spread over workers

    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("digits-cnn")
    parents = client.search_runs([exp.experiment_id], filter_string="tags.`hpolab.role` = 'study'")
    assert [p.info.run_id for p in parents] == [study.user_attrs["mlflow_parent_run_id"]]  # one parent, both workers
    runs = client.search_runs([exp.experiment_id], filter_string="attributes.run_name LIKE 'trial-%'")
    assert sorted(r.info.run_name for r in runs) == sorted(f"trial-{t.number}" for t in trials)
    for t in complete:
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.data.tags["hpolab.state"] == "COMPLETE"
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")] == [1, 2]
        assert "config.yaml" in [a.path for a in client.list_artifacts(run.info.run_id)]
        assert run.data.tags.get("hpolab.model_uri", "").startswith("models:/"), run.data.tags.get("hpolab.model_error")
    _study_check_is_clean("digits-cnn", storage, mlflow_server)


@pytest.mark.slow
def test_four_workers_through_the_grpc_storage_proxy(postgres, mlflow_server, tmp_path):
    """`hpolab storage-proxy` in front of PostgreSQL; four workers on grpc:// share one study, and
    the budget stays exact without a database lock (trials over budget are given back unrun)."""
    from hpolab.stores.trial_states import RELEASED

    database = f"postgresql+psycopg2://{postgres}/optuna"
    with storage_proxy(database, tmp_path) as grpc:  # stopped with SIGTERM (docker stop): a clean exit, asserted
        env = {**hpolab_env(), "OPTUNA_STORAGE": grpc, "MLFLOW_TRACKING_URI": mlflow_server}
        args = ["studies/digits_cnn.yaml", "name=via-proxy", "n_trials=5", "parallel=1", "trainer.max_epochs=1",
                "pruner={type: none}", "sampler={type: random}", "log_models=none"]
        workers = [start_cli("--store", str(tmp_path / f"w{i}"), "worker", *args, cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(4)]
        outs = [w.communicate(timeout=600)[0] for w in workers]
        assert [w.returncode for w in workers] == [0] * 4, outs

    trials = optuna.load_study(study_name="via-proxy", storage=database).get_trials()
    counted = [t for t in trials if not t.system_attrs.get(RELEASED)]
    assert [t.state for t in counted] == [TrialState.COMPLETE] * 5, [t.state for t in trials]
    assert all(t.state == TrialState.FAIL for t in trials if t.system_attrs.get(RELEASED))
    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("via-proxy")
    runs = client.search_runs([exp.experiment_id], filter_string="attributes.run_name LIKE 'trial-%'")
    assert sorted(r.info.run_name for r in runs) == sorted(f"trial-{t.number}" for t in counted)
    _study_check_is_clean("via-proxy", database, mlflow_server)


def _study_check_is_clean(name: str, storage: str, tracking_uri: str) -> None:
    """After the workers: both stores tell the same story (`hpolab study check`, exit 0)."""
    env = {**hpolab_env(), "OPTUNA_STORAGE": storage, "MLFLOW_TRACKING_URI": tracking_uri}
    check = run_cli("study", "check", name, cwd=ROOT, env=env, timeout=300, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.slow
def test_two_workers_are_steered_through_postgres_an_mlflow_server_and_the_grpc_proxy(postgres, mlflow_server, tmp_path):
    """One worker on PostgreSQL itself, the other through `hpolab storage-proxy`; `study pause`, `set`
    (through the proxy), `resume`, `stop` and `stop --now` reach both (test_study_steer.py says what each checks)."""
    from test_study_steer import WORKER, pause_set_resume, start_workers, stop_and_stop_now, wait_for

    database = f"postgresql+psycopg2://{postgres}/optuna"
    with storage_proxy(database, tmp_path) as grpc:
        envs = [{**hpolab_env(), "OPTUNA_STORAGE": url, "MLFLOW_TRACKING_URI": mlflow_server} for url in (database, grpc)]
        outs = [tmp_path / "direct.txt", tmp_path / "proxied.txt"]
        workers = start_workers(tmp_path / "local", outs, WORKER, envs)
        wait_for(outs[0], "started")
        study = optuna.load_study(study_name="steer", storage=database)
        direct = ["--storage", database, "--tracking-uri", mlflow_server]
        pause_set_resume(direct, outs, workers, study, cwd=tmp_path, set_via=["--storage", grpc, "--tracking-uri", mlflow_server])
        stop_and_stop_now(direct, tmp_path / "local", outs, study, cwd=tmp_path, envs=envs)
    _study_check_is_clean("steer", database, mlflow_server)
