"""Both stores of one study, read once, for `hpolab study check` (check.py, consistency.py).

An embedded store (two local SQLite files) is read with plain SQL (optuna_sql.py, mlflow_sql.py):
a clean check of 1,000 trials then takes about a second and never imports MLflow. Any other store
is read through MlflowClient (one paged search of the runs, one of the logged models) and Optuna's
tables with plain SQL where optuna_sql.py reads them (PostgreSQL), else through Optuna. Optuna's Study and the client are opened when first used
(a RUNNING trial's heartbeat, a repair).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial

from hpolab.stores import mlflow_sql, model_links_read, optuna_sql
from hpolab.stores.model_links import study_models
from hpolab.stores.paths import Stores


@dataclass
class Study:
    """Both stores of one study, read once. Optuna's Study and the MlflowClient are opened when
    first used (a RUNNING trial's heartbeat, a repair): a clean check of an embedded store, read with
    plain SQL, never imports MLflow."""

    name: str
    stores: Stores
    experiment_id: str | None
    runs: dict[str, Any]  # run id -> Run (deleted runs too; mlflow_sql.RunFacts when read with SQL)
    models: dict[str, Any]  # logged model id -> LoggedModel (or mlflow_sql.ModelFacts)
    trials: list[FrozenTrial]
    parent_id: str | None
    live: set[int] = field(default_factory=set)  # RUNNING trials whose owner may be alive
    # Claimed by a driver that is gone before it made the run (a stop signal leaves this): no disagreement,
    # the next `study run` starts it in place. Trial number -> why its driver is taken for gone.
    left_claimed: dict[int, str] = field(default_factory=dict)
    links: dict[str, Any] = field(default_factory=dict)  # live model id -> model_links_read.ModelLinks
    metric_names: list[str] | None = None  # the study's objective metrics (Optuna's metric names)
    user_attrs: dict[str, Any] = field(default_factory=dict)  # the Optuna study's (its recorded spec, metric, ...)
    opened: dict[str, Any] = field(default_factory=dict, repr=False)  # "study", "client": once opened

    @property
    def study(self):
        if "study" not in self.opened:
            from hpolab.stores.optuna_storage import load_study

            self.opened["study"] = load_study(self.name, self.stores)
        return self.opened["study"]

    @property
    def client(self):
        if "client" not in self.opened:
            from hpolab.stores.mlflow_runs import client_for

            self.opened["client"] = client_for(self.stores)
        return self.opened["client"]

    @property
    def storage(self):
        return self.study._storage

    @property
    def scheduled(self) -> bool:
        """The study's recorded spec has a trial scheduler (its dead segments are put back, not retried)."""
        return bool((self.user_attrs.get("hpolab.spec") or {}).get("trial_scheduler"))


def set_tags(s: Study, run_id: str, tags: dict[str, str]) -> None:
    from hpolab.stores.mlflow_runs import set_tags as set_run_tags

    set_run_tags(s.client, run_id, tags)


def read_study(name: str, stores: Stores) -> Study:
    """Both stores of the study: with plain SQL when both are local SQLite files (optuna_sql.py,
    mlflow_sql.py), else through Optuna and MLflow."""
    return _read_sql(name, stores) or _read_through_clients(name, stores)


def _read_sql(name: str, stores: Stores) -> Study | None:
    optuna_db, mlflow_db = stores.optuna_db, stores.tracking_db
    if optuna_db is None or mlflow_db is None or not optuna_db.is_file():
        return None
    study = optuna_sql.read_study(optuna_db, name)
    read = mlflow_sql.read_runs(mlflow_db, name, deleted=True) if study is not None else None
    if read is None:
        return None
    experiment_id, runs = read
    models = mlflow_sql.read_logged_models(mlflow_db, experiment_id) if experiment_id is not None else {}
    links = model_links_read.read_sql(mlflow_db, experiment_id) if experiment_id is not None else {}
    if models is None or links is None:
        return None
    return Study(name, stores, experiment_id, runs, models, study.trials, study.user_attrs.get("mlflow_parent_run_id"),
                 links=links, metric_names=study.metric_names, user_attrs=study.user_attrs)


def _read_through_clients(name: str, stores: Stores) -> Study:
    from mlflow.entities import ViewType

    from hpolab.stores.mlflow_runs import client_for
    from hpolab.stores.optuna_storage import load_study

    src = optuna_sql.source(stores.optuna_url)  # PostgreSQL: its tables with plain SQL (pg_read.py), one snapshot
    study = (optuna_sql.read_study(src, name) if src is not None else None) or load_study(name, stores)
    # (load_study: an unknown study or store is one line, UserError, exit 2)
    opened = {} if isinstance(study, optuna_sql.StudySnapshot) else {"study": study}
    client = client_for(stores)
    exp = client.get_experiment_by_name(name)
    runs: dict[str, Any] = {}
    models: dict[str, Any] = {}
    if exp is not None:
        token = None
        while True:
            page = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=1000, page_token=token)
            runs.update((r.info.run_id, r) for r in page)
            token = page.token
            if not token:
                break
        models = {m.model_id: m for m in study_models(client, exp.experiment_id)}
    return Study(name, stores, exp.experiment_id if exp else None, runs, models, study.get_trials(deepcopy=False),
                 study.user_attrs.get("mlflow_parent_run_id"), opened={**opened, "client": client},
                 links=model_links_read.from_models(models.values()), metric_names=study.metric_names, user_attrs=dict(study.user_attrs))
