"""`compare NAME`'s table of a study on an MLflow server, read in bulk without importing MLflow.

The Optuna side with plain SQL (optuna_sql.read_study: an embedded file or PostgreSQL), the MLflow side
over the server's REST API (stores/mlflow_rest.py): the experiment, the study metric from the parent
run, the shown trials' runs in one search (every run, paged, without --top), the live logged models
once. The same table_of() as through Optuna and MlflowClient builds the table, with what study_frame
reads, so the rows are the same. None when either side cannot be read this way (another store, a
request that fails): the caller goes through Optuna and MlflowClient, which say what is wrong.
"""

from __future__ import annotations

from hpolab.analysis.compare.study import StudyTable, table_of, top_numbers
from hpolab.stores import mlflow_rest, optuna_sql
from hpolab.stores.paths import Stores


def rest_study_table(name: str, stores: Stores, top: tuple[str, int] | None) -> StudyTable | None:
    src = optuna_sql.source(stores.optuna_url)
    rest = mlflow_rest.rest_for(stores.tracking_uri)
    if src is None or rest is None:
        return None
    study = optuna_sql.read_study(src, name)
    if study is None:
        return None
    try:
        return _table(study, rest, top)
    except mlflow_rest.RestError:
        return None
    finally:
        rest.close()


def study_metric(study, rest: mlflow_rest.Rest) -> str:
    """compare.study.study_metric's: the parent run's `metric` param, else the first trials' runs'."""
    for run_id in [study.user_attrs.get("mlflow_parent_run_id")] + [t.user_attrs.get("mlflow_run_id") for t in study.trials[:3]]:
        run = mlflow_rest.get_run(rest, run_id) if run_id else None
        if run is not None and run.data.params.get("metric"):
            return run.data.params["metric"]
    return "value"


def _table(study, rest: mlflow_rest.Rest, top: tuple[str, int] | None) -> StudyTable:
    experiment = mlflow_rest.experiment_id(rest, study.study_name)
    metric = study_metric(study, rest)
    if top is None:
        runs = mlflow_rest.search_runs(rest, experiment) if experiment is not None else {}
        found = bool(runs)
    else:
        only = top_numbers(study, metric, *top)
        ids = [t.user_attrs["mlflow_run_id"] for t in study.trials if t.number in only and t.user_attrs.get("mlflow_run_id")]
        runs = mlflow_rest.runs_by_id(rest, experiment, ids) if experiment is not None and ids else {}
        found = experiment is not None
    models = None
    if runs:
        try:
            models = {m.model_id: m.name for m in mlflow_rest.logged_models(rest, experiment).values()}
        except mlflow_rest.RestError:  # an older server without logged models: the run tags alone say which model
            models = None
    return table_of(study, metric, {k: (r.data.tags, r.data.metrics) for k, r in runs.items()}, found, models)
