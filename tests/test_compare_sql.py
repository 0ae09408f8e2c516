"""`compare NAME` on an embedded store reads both SQLite databases with plain SQL (compare_sql.py):
it must give exactly the table that reading through Optuna and MlflowClient gives, fall back to
them when it cannot read a file, and import no MLflow."""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys

import optuna
import pandas as pd
import pytest
from mlflow import MlflowClient
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from conftest import ROOT, STUDY, hpolab_env
from hpolab.analysis.compare.sql import sql_study_table
from hpolab.analysis.compare.study import study_frame, study_metric, top_numbers
from hpolab.stores import mlflow_sql
from hpolab.stores.paths import resolve_stores

DISTS = {"lr": FloatDistribution(1e-4, 1e-1, log=True), "width": CategoricalDistribution([8, "wide", None]),
         "depth": IntDistribution(1, 4)}


def _trial(client, exp, parent, state, values, params, steps=(), metrics=None, attrs=None):
    run = client.create_run(exp, tags={"mlflow.parentRunId": parent, "hpolab.state": state.name}).info.run_id
    for k, v in (metrics or {}).items():
        client.log_metric(run, k, v)
    client.log_param(run, "metric", "val_acc")
    return create_trial(state=state, values=values, params=params, distributions={k: DISTS[k] for k in params},
                        intermediate_values=dict(enumerate(steps)), user_attrs={"mlflow_run_id": run, **(attrs or {})})


def _store(store, name, directions):
    """A study whose trials have runs: inf values, a NaN metric, a deleted run, a trial without a run,
    categorical params of mixed types, RUNNING and WAITING trials."""
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = client.create_experiment(name, artifact_location=str(store / "artifacts"))
    parent = client.create_run(exp).info.run_id
    client.log_param(parent, "metric", "val_acc")
    study = optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name=name, directions=directions)
    study.set_user_attr("mlflow_parent_run_id", parent)
    if len(directions) > 1:
        study.set_metric_names(["val_acc", "latency_ms"])
    n = len(directions)
    rows = [(TrialState.COMPLETE, [0.9, 2.0], {"lr": 1e-3, "width": "wide", "depth": 2}, (0.5, 0.9), {"val_acc": 0.88, "latency_ms": 2.0}),
            (TrialState.COMPLETE, [0.95, 3.0], {"lr": 3e-3, "width": 8, "depth": 3}, (0.6, 0.95), {"val_acc": float("nan")}),
            (TrialState.COMPLETE, [float("inf"), 1.0], {"lr": 2e-2, "width": None, "depth": 1}, (0.7,), {"val_acc": 0.7}),
            (TrialState.PRUNED, None, {"lr": 5e-2, "width": 8, "depth": 4}, (0.1,), {"val_acc": 0.1}),
            (TrialState.FAIL, None, {"lr": 1e-4}, (), {})]
    for state, values, params, steps, metrics in rows:
        study.add_trial(_trial(client, exp, parent, state, values[:n] if values else None, params, steps, metrics,
                               {"fail_reason": "NaN loss"} if state == TrialState.FAIL else None))
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[0.5, 9.0][:n], params={"depth": 2}, distributions={"depth": DISTS["depth"]}))
    client.delete_run(study.trials[1].user_attrs["mlflow_run_id"])  # a deleted run: MLflow's search leaves it out
    # logged models: trial 0's is live; trial 2's is deleted (its run still names it); trial 3's run
    # says retention deleted it
    for number in (0, 2, 3):
        run = study.trials[number].user_attrs["mlflow_run_id"]
        model = client.create_logged_model(exp, name=f"{name}-trial-{number}", source_run_id=run)
        client.set_tag(run, "hpolab.model_id", model.model_id)
    client.delete_logged_model(client.get_run(study.trials[2].user_attrs["mlflow_run_id"]).data.tags["hpolab.model_id"])
    client.set_tag(study.trials[3].user_attrs["mlflow_run_id"], "hpolab.model_deleted", "pushed out of log_models: top_k 1")
    study.ask()
    study.enqueue_trial({"depth": 3})
    return client, study


def _through_optuna_and_mlflow(store, name, top):
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{store / 'optuna.db'}")
    exp = client.get_experiment_by_name(name).experiment_id
    metric = study_metric(study, client, exp)
    only = top_numbers(study, metric, *top) if top else None
    return study_frame(study, client, exp, metric, only=only)


def _same(a, b):
    assert (a.name, a.metric, a.direction, a.params, a.mlflow_found, a.objectives, a.objective_directions) == \
        (b.name, b.metric, b.direction, b.params, b.mlflow_found, b.objectives, b.objective_directions)
    now = ["duration_s"]  # a RUNNING trial's duration runs to "now": read a moment apart
    pd.testing.assert_frame_equal(a.frame.drop(columns=now), b.frame.drop(columns=now))


@pytest.mark.parametrize("directions", [["maximize"], ["maximize", "minimize"]])
def test_the_sql_table_equals_optunas_and_mlflows(store, directions):
    _store(store, "sq", directions)
    stores = resolve_stores(str(store))
    for top in (None, ("all", 2), ("complete", 1), ("pruned", 3)):
        sql = sql_study_table("sq", stores, top)
        assert sql is not None
        _same(sql, _through_optuna_and_mlflow(store, "sq", top))
    full = sql_study_table("sq", stores, None).frame.set_index("trial")
    assert math.isnan(full.loc[0, "metrics.val_acc"]) is False and "metrics.latency_ms" in full.columns
    assert full.loc[1, "run_id"] is not None and pd.isna(full.loc[1, "final_val_acc"]) is False  # its run deleted: Optuna's side
    assert full.loc[4, "fail_reason"] == "NaN loss" and full.loc[2, "params.width"] is None
    model_id = full.loc[0, "model_id"]
    assert (full.loc[0, "model_name"], full.loc[0, "model_uri"]) == ("sq-trial-0", f"models:/{model_id}") and model_id.startswith("m-")
    assert full.loc[[1, 2, 3, 4, 5], ["model_id", "model_name", "model_uri"]].isna().all().all()  # deleted, or none logged


def test_it_falls_back_when_it_cannot_read_the_file(store):
    _store(store, "sq", ["maximize"])
    stores = resolve_stores(str(store))
    assert sql_study_table("nope", stores, None) is None  # no such study: Optuna's reader says so
    exp, _ = mlflow_sql.read_runs(store / "mlflow.db", "sq", [])
    assert mlflow_sql.read_run_series(store / "mlflow.db", exp, "0" * 32, "lr-range-test", ("x",)) == ("0" * 32, None, {})
    assert mlflow_sql.read_run_series(store / "mlflow.db", exp, None, "lr-range-test", ("x",)) == (None, {}, {})
    assert mlflow_sql.read_registry(store / "mlflow.db", "sq", "sq").found is False
    con = sqlite3.connect(store / "mlflow.db")
    with con:
        con.execute("ALTER TABLE latest_metrics RENAME COLUMN is_nan TO nan_flag")  # a schema this does not know
    con.close()
    assert mlflow_sql.read_runs(store / "mlflow.db", "sq", None) is None
    assert mlflow_sql.read_registry(store / "mlflow.db", "sq", "sq") is None
    assert mlflow_sql.read_run_series(store / "mlflow.db", exp, None, "lr-range-test", ("x",)) is None
    assert sql_study_table("sq", stores, None) is None
    assert mlflow_sql.read_runs(store / "missing.db", "sq", None) is None and not (store / "missing.db").exists()


@pytest.mark.parametrize("query", ["", "?timeout=30"])  # SQLAlchemy's connection options: the same file
def test_compare_imports_no_mlflow(store, query):
    _store(store, "sq", ["maximize"])
    urls = [f"--storage=sqlite:///{store / 'optuna.db'}{query}", f"--tracking-uri=sqlite:///{store / 'mlflow.db'}{query}"]
    code = ("import sys, runpy; sys.argv = ['hpolab', '--store', sys.argv[1], *sys.argv[2:], 'compare', 'sq', '--top', '2', '--format', 'csv']\n"
            "try:\n    runpy.run_module('hpolab.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('MLFLOW' if 'mlflow' in sys.modules else 'NO-MLFLOW')")
    out = subprocess.run([sys.executable, "-c", code, str(store), *urls], capture_output=True, text=True,
                         env=hpolab_env(), cwd=ROOT, check=True).stdout
    assert "0.95" in out and "inf" in out  # the two best: trial 2 (inf) and trial 1
    assert out.strip().endswith("NO-MLFLOW")


@pytest.mark.slow
def test_the_sql_table_equals_optunas_on_a_real_study(template):
    stores = resolve_stores(str(template))
    for top in (None, ("complete", 1), ("all", 3)):
        _same(sql_study_table(STUDY, stores, top), _through_optuna_and_mlflow(template, STUDY, top))
