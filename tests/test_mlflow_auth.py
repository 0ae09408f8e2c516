"""The secure path for a cluster network: `mlflow server --app-name basic-auth`, workers passing
credentials through MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (never on a command line).

A real server with MLflow's basic-auth app (its users in a SQLite file of its own); a study runs
against it with the credentials in the environment; without them hpolab says, in one line, that
authentication failed and which variables to set; the bare REST API answers 401.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from conftest import ROOT, hpolab_env, run_cli
from services import free_port, wait_for_http

pytestmark = pytest.mark.slow
ADMIN, PASSWORD = "hpolab-admin", "s3cret-for-tests-only"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory, migrated_store):
    tmp = tmp_path_factory.mktemp("mlflow-auth")
    shutil.copy(migrated_store / "mlflow.db", tmp / "mlflow.db")  # migrated once per session, not by this server
    ini = tmp / "basic_auth.ini"
    # MLflow's own default config with its users' database in our temp folder; the admin password
    # comes from the environment, as from a Kubernetes Secret, not from the file.
    ini.write_text("[mlflow]\ndefault_permission = READ\n"
                   f"database_uri = sqlite:///{tmp / 'basic_auth.db'}\n"
                   "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                   "auth_cache_ttl_seconds = 300\n")  # as README advises: no scrypt check on every request
    port = free_port()
    env = {**hpolab_env(), "MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN,
           "MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORD,
           "MLFLOW_FLASK_SERVER_SECRET_KEY": "csrf-key-for-tests-only",  # basic-auth refuses to start without one
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # as compose and the k8s manifests run it
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth",
         "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}", "--artifacts-destination", (tmp / "artifacts").as_uri(),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{url}/health", proc)  # /health is the one route basic-auth leaves open
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_rest_api_refuses_an_unauthenticated_client(auth_server):
    req = urllib.request.Request(f"{auth_server}/api/2.0/mlflow/experiments/search", method="POST",
                                 data=json.dumps({"max_results": 1}).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 401


def test_a_study_runs_with_credentials_from_the_environment_and_not_without(auth_server, store):
    from mlflow import MlflowClient

    args = ["--store", str(store), "--tracking-uri", auth_server, "study", "run", "studies/digits_cnn.yaml",
            "name=authed", "n_trials=2", "parallel=1", "trainer.max_epochs=1", "pruner={type: none}"]
    anonymous = run_cli(*args, check=False)
    assert anonymous.returncode == 2, anonymous.stdout + anonymous.stderr
    said = anonymous.stdout + anonymous.stderr
    assert "Traceback" not in said, said
    assert "authentication failed" in said and "MLFLOW_TRACKING_USERNAME" in said and "MLFLOW_TRACKING_PASSWORD" in said, said
    assert PASSWORD not in said

    creds = {"MLFLOW_TRACKING_USERNAME": ADMIN, "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    out = run_cli(*args, env={**hpolab_env(), **creds}, cwd=ROOT)
    assert PASSWORD not in out.stdout + out.stderr

    import os

    os.environ.update(creds)  # the test's own client authenticates the same way
    try:
        client = MlflowClient(tracking_uri=auth_server)
        exp = client.get_experiment_by_name("authed")
        runs = client.search_runs([exp.experiment_id], filter_string="attributes.run_name LIKE 'trial-%'")
        assert sorted(r.info.run_name for r in runs) == ["trial-0", "trial-1"]
        assert {r.data.tags["hpolab.state"] for r in runs} == {"COMPLETE"}
    finally:
        for k in creds:
            os.environ.pop(k, None)
