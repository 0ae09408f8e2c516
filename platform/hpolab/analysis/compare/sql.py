"""`compare NAME`'s table of an embedded store, read with plain SQL.

Both databases of a local store are SQLite files: the study is read with optuna_sql.read_study and
the runs with mlflow_sql.read_runs, then the same table_of() as through Optuna and MLflow builds the
table. Nothing here decides what a row says; this only replaces how the data is read. None when
either store is not a local SQLite file this can read: the caller goes through Optuna and MLflow.
"""

from __future__ import annotations

from pathlib import Path

from hpolab.analysis.compare.study import StudyTable, table_of, top_numbers
from hpolab.stores import mlflow_sql, optuna_sql
from hpolab.stores.paths import Stores


def sql_study_table(name: str, stores: Stores, top: tuple[str, int] | None) -> StudyTable | None:
    optuna_db, mlflow_db = stores.optuna_db, stores.tracking_db
    if optuna_db is None or mlflow_db is None or not optuna_db.is_file():
        return None
    study = optuna_sql.read_study(optuna_db, name)
    if study is None:
        return None
    if not mlflow_db.exists():  # as tracking_client(): reading never creates it; Optuna's side alone
        return table_of(study, "value", {}, False)
    first = first_runs(mlflow_db, study)
    if first is None:
        return None
    experiment_id, _, metric = first
    if top is None:
        read = mlflow_sql.read_runs(mlflow_db, name, None)
        found = bool(read and read[1])
    else:
        only = top_numbers(study, metric, *top)
        read = mlflow_sql.read_runs(mlflow_db, name, [t.user_attrs["mlflow_run_id"] for t in study.trials
                                                      if t.number in only and t.user_attrs.get("mlflow_run_id")])
        found = experiment_id is not None
    models = live_models(mlflow_db, experiment_id)
    if read is None or models is False:
        return None
    return table_of(study, metric, {k: (r.data.tags, r.data.metrics) for k, r in read[1].items()}, found, models)


def live_models(mlflow_db: Path, experiment_id: str | None) -> dict[str, str] | None | bool:
    """The experiment's logged models that are not deleted, id -> name (compare_study.logged_models);
    None without an experiment; False when the file cannot be read here."""
    if experiment_id is None:
        return None
    read = mlflow_sql.read_logged_models(mlflow_db, experiment_id)
    return False if read is None else {m.model_id: m.name for m in read.values()}


def first_runs(mlflow_db: Path, study) -> tuple[str | None, dict[str, mlflow_sql.RunFacts], str] | None:
    """(experiment id, the parent run and the first trials' runs, the study metric). Optuna does not
    store the metric; the parent run's params do (compare_study.study_metric)."""
    ids = [study.user_attrs.get("mlflow_parent_run_id")] + [t.user_attrs.get("mlflow_run_id") for t in study.trials[:3]]
    ids = [r for r in ids if r]
    read = mlflow_sql.read_runs(mlflow_db, study.study_name, ids, deleted=True)  # (as MlflowClient.get_run: deleted too)
    if read is None:
        return None
    experiment_id, runs = read
    metric = next((runs[r].data.params["metric"] for r in ids if r in runs and runs[r].data.params.get("metric")), "value")
    return experiment_id, runs, metric
