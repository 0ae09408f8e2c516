"""The report's data of an embedded store, read with plain SQL: no MLflow import.

report_data.gather reads the MLflow side through MlflowClient: importing MLflow and opening its store
took about 3.5 s of a 1,000-trial report. For two local SQLite files this reads the same things with
mlflow_sql.py (the parent run, the shown trials' runs, the LR range test's series, the Model Registry)
into the same ReportData, shaped by the same helpers (table_of, lr_curve, registered). None when a
file cannot be read this way: the caller gathers through the clients.
"""

from __future__ import annotations

from collections import Counter

from hpolab.analysis.compare.sql import first_runs, live_models
from hpolab.analysis.compare.study import table_of, top_numbers
from hpolab.analysis.report.data import LR_KEYS, LR_RUN_NAME, TOP_ROWS, ReportData, lr_curve, registered
from hpolab.analysis.report.race import read_race
from hpolab.stores import mlflow_sql
from hpolab.stores.paths import Stores
from hpolab.study.objectives.ranking import primary_direction


def gather_sql(study, stores: Stores) -> ReportData | None:
    optuna_db, mlflow_db = stores.optuna_db, stores.tracking_db
    if optuna_db is None or mlflow_db is None or not mlflow_db.is_file():
        return None
    first = first_runs(mlflow_db, study)
    if first is None:
        return None
    experiment_id, runs, metric = first
    problems: list[str] = []
    parent_id = study.user_attrs.get("mlflow_parent_run_id")
    if parent_id and parent_id not in runs:
        problems.append(f"the study's parent run {parent_id} is not in the tracking store")
    only = top_numbers(study, metric, "complete", TOP_ROWS, ("FAIL",))
    shown = mlflow_sql.read_runs(mlflow_db, study.study_name, [t.user_attrs["mlflow_run_id"] for t in study.get_trials()
                                                                if t.number in only and t.user_attrs.get("mlflow_run_id")])
    lr_test = _lr_test(study, mlflow_db, experiment_id, problems)
    promotion = _promotion(study.study_name, mlflow_db)
    models = live_models(mlflow_db, experiment_id)
    if shown is None or lr_test is False or promotion is None or models is False:
        return None
    table = table_of(study, metric, {k: (r.data.tags, r.data.metrics) for k, r in shown[1].items()}, experiment_id is not None, models)
    counts = Counter(t.state.name for t in study.get_trials())
    return ReportData(study, metric, primary_direction(study, metric), counts, None, experiment_id, runs.get(parent_id), table,
                      lr_test=lr_test, promotion=promotion, problems=problems, race=read_race(study))


def _lr_test(study, mlflow_db, experiment_id: str | None, problems: list[str]):
    """As report_data._lr_test; False when the file cannot be read here."""
    attr = study.user_attrs.get("lr_range_test") or None
    run_id = (attr or {}).get("mlflow_run_id")
    if experiment_id is None and not run_id:
        return {"attr": attr, "run_id": None, "lr": [], "loss": [], "smoothed": []} if attr else None
    read = mlflow_sql.read_run_series(mlflow_db, experiment_id or "-1", run_id, LR_RUN_NAME, LR_KEYS)
    if read is None:
        return False
    run_id, series, params = read
    if not run_id:
        return {"attr": attr, "run_id": None, "lr": [], "loss": [], "smoothed": []} if attr else None
    if series is None:
        problems.append(f"LR range test run not readable: no run {run_id} in the tracking store")
        return {"attr": attr, "run_id": run_id, "lr": [], "loss": [], "smoothed": []} if attr else None
    return lr_curve(attr, run_id, series, params)


def _promotion(name: str, mlflow_db) -> dict | None:
    """As report_data._promotion; None when the file cannot be read here."""
    reg = mlflow_sql.read_registry(mlflow_db, name, name)
    if reg is None:
        return None
    if not reg.found:
        return {"state": "none"}
    champion = next((v for v in reg.versions if "champion" in reg.aliases and v.version == reg.aliases["champion"]), None)
    return registered(reg.name, reg.aliases, reg.versions, champion)
