"""The read commands on a team's stores (PostgreSQL for Optuna) read in bulk: Optuna's tables with plain
SQL through psycopg2 (stores/pg_read.py), one connection and a few queries, never Optuna's
RDBStorage trial by trial; and they must give exactly what the Optuna reader gives."""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from conftest import ROOT, hpolab_env, run_cli
from services import HAVE_POSTGRES, NO_POSTGRES, as_postgres, postgres_cluster
from hpolab.stores import optuna_sql
from hpolab.stores.paths import Stores
from hpolab.stores.studies import _rows_from_optuna, _rows_from_sql
from hpolab.study.objectives.ranking import best, front

pytestmark = pytest.mark.skipif(not HAVE_POSTGRES, reason=NO_POSTGRES)

DIST = {"trainer.lr": FloatDistribution(1e-4, 1e-1, log=True), "model.channels": IntDistribution(8, 64),
        "trainer.optimizer": CategoricalDistribution(["adamw", "sgd"])}
PARAMS = {"trainer.lr": 0.003, "model.channels": 16, "trainer.optimizer": "sgd"}


@pytest.fixture(scope="module")
def storage():
    with postgres_cluster() as (bin_dir, port, _):
        as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "optuna")
        url = f"postgresql+psycopg2://postgres@127.0.0.1:{port}/optuna"
        _studies(url)
        yield url


def _add(study, state, values=None, system=None, user=None, steps=None):
    study.add_trial(create_trial(state=state, values=values, params=PARAMS, distributions=DIST, system_attrs=system,
                                 user_attrs=user, intermediate_values=steps))


def _studies(url: str) -> None:
    one = optuna.create_study(storage=url, study_name="one-max", direction="maximize")
    one.set_user_attr("metric", "val_acc")
    for i, v in enumerate((0.5, 0.9, 0.9, 0.7)):
        _add(one, TrialState.COMPLETE, [v], user={"mlflow_run_id": f"{i:032x}"}, steps={1: v - 0.1, 2: v})
    _add(one, TrialState.COMPLETE, [0.99], {"hpolab.imported_from": "older"})  # a warm start's: no result here
    _add(one, TrialState.PRUNED, steps={1: float("nan")})
    _add(one, TrialState.FAIL, system={"retry_history": [1]})
    one.ask()  # RUNNING
    one.enqueue_trial({"trainer.lr": 0.01})  # WAITING
    low = optuna.create_study(storage=url, study_name="a-min", direction="minimize")
    _add(low, TrialState.COMPLETE, [float("inf")])
    _add(low, TrialState.COMPLETE, [float("-inf")], steps={1: float("inf")})
    multi = optuna.create_study(storage=url, study_name="pareto", directions=["maximize", "minimize"])
    multi.set_metric_names(["val_acc", "latency_ms"])
    for values, c in (([0.9, 1.0], [0.0]), ([0.95, 2.0], [0.0]), ([0.99, 0.5], [3.0])):
        _add(multi, TrialState.COMPLETE, values, {"constraints": c})
    _add(multi, TrialState.COMPLETE, [0.999, 0.1], {"constraints:params <= 20000": 5.0})
    optuna.create_study(storage=url, study_name="pareto~pruning")  # a companion: never listed
    optuna.create_study(storage=url, study_name="empty", directions=["minimize", "minimize"])


def _stores(tmp_path, url: str) -> Stores:
    return Stores(tmp_path, url, f"sqlite:///{tmp_path / 'mlflow.db'}", None)


def test_plain_sql_on_postgres_gives_optunas_trials_and_study_rows(storage, tmp_path):
    for name in ("one-max", "a-min", "pareto", "empty"):
        snap = optuna_sql.read_study(optuna_sql.source(storage), name)
        assert snap is not None, name
        study = optuna.load_study(study_name=name, storage=storage)
        assert repr(snap.get_trials()) == repr(study.get_trials()), name  # (repr: NaN == NaN)
        assert (snap.directions, snap.user_attrs) == (study.directions, study.user_attrs)
    stores = _stores(tmp_path, storage)
    assert _rows_from_sql(stores, optuna_sql.read_studies(storage), front, best) == _rows_from_optuna(stores, front, best)
    directions, rows = optuna_sql.read_trials(storage, "one-max")
    trials = optuna.load_study(study_name="one-max", storage=storage).get_trials()
    assert directions == ["maximize"]
    assert [(r.number, r.state, r.value, r.params, r.steps, r.run_id) for r in rows] == \
        [(t.number, t.state.name, t.values[0] if t.values else None, t.params, len(t.intermediate_values), t.user_attrs.get("mlflow_run_id"))
         for t in trials]


def test_a_bad_read_falls_back_to_optuna(storage):
    assert optuna_sql.read_study(storage.replace("/optuna", "/no-such-db"), "one-max") is None
    assert optuna_sql.read_study(storage, "no-such-study") is None
    assert optuna_sql.source("postgresql+pg8000://u@h/db") is None  # another driver: Optuna reads it


def _imports(storage: str, tmp_path, *args: str) -> str:
    """What `hpolab ARGS` imported (a fresh interpreter, the real CLI's main) and its output."""
    code = ("import sys, runpy; sys.argv = ['hpolab', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('hpolab.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('IMPORTED', *sorted(m for m in ('optuna', 'mlflow', 'sqlalchemy') if m in sys.modules))")
    env = {**hpolab_env(), "OPTUNA_STORAGE": storage, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    out = subprocess.run([sys.executable, "-c", code, "--store", str(tmp_path), *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_status_and_list_on_postgres_read_without_optuna(storage, tmp_path):
    status = _imports(storage, tmp_path, "study", "status", "one-max")
    assert status.splitlines()[-1] == "IMPORTED", status  # neither Optuna nor SQLAlchemy: psycopg2 alone
    assert "best: trial 1 value 0.9" in status
    listed = _imports(storage, tmp_path, "study", "list")
    assert listed.splitlines()[-1] == "IMPORTED", listed


def test_status_on_postgres_prints_what_the_optuna_reader_prints(storage, tmp_path, capsys, monkeypatch):
    from hpolab.analysis import status

    stores = _stores(tmp_path, storage)
    for limit in (None, 3):
        status.print_status("one-max", stores, limit)
        sql = capsys.readouterr().out
        with monkeypatch.context() as m:
            m.setattr(status, "_read_sql", lambda *a: None)
            status.print_status("one-max", stores, limit)
        assert sql == capsys.readouterr().out


# ---------------------------------------------------------------- an MLflow server (slow: it starts one)


@pytest.fixture(scope="module")
def server(storage, tmp_path_factory):
    """`mlflow server` on PostgreSQL with served artifacts; a study `team` in both stores (no training:
    Optuna trials and MLflow runs made through the APIs, as the driver tags them)."""
    from services import free_port, wait_for_http

    import psycopg2

    con = psycopg2.connect(host="127.0.0.1", port=int(storage.rsplit(":", 1)[1].split("/")[0]), user="postgres", dbname="optuna")
    con.autocommit = True
    con.cursor().execute("CREATE DATABASE mlflow")
    con.close()
    port = free_port()
    artifacts = tmp_path_factory.mktemp("served")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", storage.replace("/optuna", "/mlflow"),
                             "--artifacts-destination", artifacts.as_uri(), "--serve-artifacts", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**hpolab_env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    wait_for_http(f"{url}/health", proc)
    try:
        _team_study(storage, url)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _team_study(storage: str, url: str) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=url)
    exp = client.create_experiment("team")
    parent = client.create_run(exp, run_name="study", tags={"hpolab.role": "study"})
    client.log_param(parent.info.run_id, "metric", "val_acc")
    study = optuna.create_study(storage=storage, study_name="team", direction="maximize")
    study.set_user_attr("mlflow_parent_run_id", parent.info.run_id)
    model = client.create_logged_model(exp, name="team-trial-2")
    for n, (state, v) in enumerate([(TrialState.COMPLETE, 0.8), (TrialState.PRUNED, None), (TrialState.COMPLETE, 0.95),
                                    (TrialState.FAIL, None), (TrialState.COMPLETE, 0.9), (TrialState.COMPLETE, float("inf"))]):
        run = client.create_run(exp, run_name=f"trial-{n}", tags={"mlflow.parentRunId": parent.info.run_id, "optuna.study": "team",
                                                                  "optuna.trial_number": str(n), "hpolab.state": state.name,
                                                                  **({"hpolab.model_id": model.model_id} if n == 2 else {}),
                                                                  **({"hpolab.fail_reason": "boom"} if state == TrialState.FAIL else {})})
        for epoch in (1, 2):
            client.log_metric(run.info.run_id, "val_acc", (v or 0.5) - 0.1 / epoch, step=epoch)
        client.set_terminated(run.info.run_id, {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}[state.name])
        _add(study, state, [v] if state == TrialState.COMPLETE else None, user={"mlflow_run_id": run.info.run_id},
             steps={1: 0.5, 2: v if v is not None else 0.4})
        if n == 4:
            client.delete_run(run.info.run_id)  # a deleted run: its row holds Optuna's side only


def _team_stores(tmp_path, storage: str, url: str) -> Stores:
    return Stores(tmp_path, storage, url, None)


@pytest.mark.slow
def test_compare_on_a_server_reads_in_a_few_requests_what_the_clients_read(storage, server, tmp_path, monkeypatch):
    from hpolab.analysis.compare import command
    from hpolab.stores import mlflow_rest

    stores = _team_stores(tmp_path, storage, server)
    calls = []
    call = mlflow_rest.Rest.call
    monkeypatch.setattr(mlflow_rest.Rest, "call", lambda self, *a: (calls.append(a[1]), call(self, *a))[1])
    for top in (2, None):
        calls.clear()
        table, rows = command.study_rows("team", stores, top=top)
        # the experiment, the parent run's metric, one search of the runs, one of the logged models
        assert calls == ["experiments/get-by-name", "runs/get", "runs/search", "logged-models/search"], calls
        with monkeypatch.context() as m:
            m.setattr(command, "rest_study_table", lambda *a: None)
            want_table, want = command.study_rows("team", stores, top=top)
        assert rows.to_json() == want.to_json() and table.frame.to_json() == want_table.frame.to_json()
        assert (table.metric, table.mlflow_found) == (want_table.metric, want_table.mlflow_found) == ("val_acc", True)
    assert "team-trial-2" in list(table.frame["model_name"])


@pytest.mark.slow
def test_check_on_a_server_reads_optunas_tables_and_finds_what_the_optuna_reader_finds(storage, server, tmp_path, monkeypatch):
    from hpolab.analysis import check, check_read

    stores = _team_stores(tmp_path, storage, server)
    s = check_read.read_study("team", stores)
    assert "study" not in s.opened  # Optuna's tables read with plain SQL; its Study opened only for a repair
    found = [(p.trial, p.what, p.fix) for p in check.find_problems(s)]
    with monkeypatch.context() as m:
        m.setattr(check_read.optuna_sql, "read_study", lambda *a: None)
        via_optuna = check_read.read_study("team", stores)
        assert "study" in via_optuna.opened
        assert [(p.trial, p.what, p.fix) for p in check.find_problems(via_optuna)] == found
    assert found and {t for t, _, _ in found} >= {0, 4}  # (fabricated runs: no checkpoints; trial 4's run deleted)


@pytest.mark.slow
def test_compare_and_check_on_a_server_through_the_cli(storage, server, tmp_path):
    env = {**hpolab_env(), "OPTUNA_STORAGE": storage, "MLFLOW_TRACKING_URI": server}
    code = ("import sys, runpy; sys.argv = ['hpolab', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('hpolab.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('IMPORTED', *sorted(m for m in ('optuna', 'mlflow', 'sqlalchemy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, "--store", str(tmp_path), "compare", "team", "--top", "3"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "IMPORTED optuna", out.stdout  # (Optuna: its FrozenTrial; no MLflow, no SQLAlchemy)
    assert out.stdout.rsplit("IMPORTED", 1)[0] == run_cli("--store", str(tmp_path), "compare", "team", "--top", "3", env=env).stdout
    check = run_cli("--store", str(tmp_path), "study", "check", "team", "--json", env=env, check=False)
    assert check.returncode == 1 and '"what"' in check.stdout  # (fabricated runs: no checkpoints, no models; found in one read)
