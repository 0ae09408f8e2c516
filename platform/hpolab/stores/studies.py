"""The studies in a store, as a whole: list them, delete one.

A study is spread over three places: the Optuna study (trials, params, values), the MLflow
experiment of the same name (runs, metrics, artifacts, logged models) and local folders under
the store (trial checkpoints in trials/NAME/, LR range test outputs in lr-find/NAME/).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from hpolab.errors import UserError
from hpolab.stores.paths import Stores
from hpolab.stores.trial_counts import count_trials

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True)
class StudyRow:
    name: str
    direction: str
    metric: str | None  # None: no MLflow parent run to read it from
    counts: dict[str, int]  # stores/trial_counts.py's: complete / pruned / fail / running / waiting, finished, retried, ...
    best_value: float | None
    last_activity: datetime | None
    objectives: list[str] | None = None  # several objectives: their names (study.metric_names); one: None
    front_size: int | None = None  # several objectives: trials on the feasible Pareto front (None: no complete trial)


@dataclass
class Deleted:
    name: str
    trials: int
    experiment_id: str | None  # the MLflow experiment soft-deleted (None: there was none)
    experiment_renamed_to: str | None
    folders: list[Path] = field(default_factory=list)


def _storage_or_none(stores: Stores) -> optuna.storages.BaseStorage | None:
    """The Optuna storage, or None for a default SQLite store that does not exist (not created here)."""
    import optuna  # here, not at the top: `study list` of an empty store needs no Optuna (a second)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if stores.optuna_db is not None and not stores.optuna_db.is_file():
        return None
    from hpolab.stores.optuna_storage import open_storage

    return open_storage(stores.optuna_url)


# A study of several objectives prunes through a companion study in the same storage
# (study/objectives/pruning.py); it is part of its study, never listed as one. '~' is not allowed in study names.
COMPANION_SUFFIX = "~pruning"


def is_companion(study_name: str) -> bool:
    return study_name.endswith(COMPANION_SUFFIX)


def study_names(stores: Stores) -> list[str]:
    storage = _storage_or_none(stores)
    if storage is None:
        return []
    return sorted(s.study_name for s in storage.get_all_studies() if not is_companion(s.study_name))  # names only: no trial is read


def list_studies(stores: Stores, front: Callable[[list, list], list] | None = None,
                 best: Callable[[list, list], object] | None = None) -> list[StudyRow]:
    """One row per study in the Optuna storage (sorted by name). The metric comes from the study's
    `metric` attr, else the MLflow parent run's params (the spec is logged there), found via the
    study's `mlflow_parent_run_id`. study/objectives/ranking.py, which this layer cannot import, decides:
    `best(trials, directions)` gives a one-objective study's best trial (feasible, its own: None
    without `best`), `front(trials, directions)` the feasible Pareto front of one of several.
    Counts are trial_counts.py's (the budget's). An embedded store or a PostgreSQL storage is read
    with plain SQL when its schema is known (optuna_sql.py: no Optuna)."""
    from hpolab.stores.optuna_sql import read_studies, source

    src = source(stores.optuna_url)  # an embedded store's file, or a PostgreSQL storage's URL
    if src is not None:
        if isinstance(src, Path) and not src.is_file():
            return []
        data = read_studies(src)
        if data is not None:
            return _rows_from_sql(stores, data, front, best)
    return _rows_from_optuna(stores, front, best)


def _rows_from_optuna(stores: Stores, front: Callable[[list, list], list] | None,
                      best: Callable[[list, list], object] | None = None) -> list[StudyRow]:
    """list_studies' rows read through Optuna's storage (any database)."""
    storage = _storage_or_none(stores)
    if storage is None:
        return []
    # One read of each study's trials (optuna.get_all_study_summaries would read them all again,
    # deep-copied, just for the best value and the start time).
    studies = sorted(storage.get_all_studies(), key=lambda s: s.study_name)
    clients: list = []
    rows = []
    for s in studies:
        if is_companion(s.study_name):
            continue
        trials = storage.get_all_trials(storage.get_study_id_from_name(s.study_name), deepcopy=False)
        counts = count_trials(trials)
        stamps = [d for t in trials for d in (t.datetime_complete, t.datetime_start) if d is not None]
        metric = _metric(stores, clients, s.user_attrs)
        directions = s.directions
        multi = len(directions) > 1
        names = s.system_attrs.get("study:metric_names")  # what Study.metric_names reads (no second read here)
        rows.append(
            StudyRow(
                name=s.study_name,
                direction="/".join(d.name.lower() for d in directions),
                metric=metric,
                counts=counts,
                best_value=_best_value(trials, directions, best),
                last_activity=max(stamps) if stamps else None,  # (no stamps: no trial started)
                objectives=list(names) if multi and names else None,
                front_size=len(front(trials, directions)) if multi and front is not None and counts["complete"] else None,
            )
        )
    return rows


def _metric(stores: Stores, clients: list, user_attrs: dict) -> str | None:
    """The study's metric: its `metric` attr, else (older studies) its MLflow parent run's param."""
    metric, parent = user_attrs.get("metric"), user_attrs.get("mlflow_parent_run_id")
    if metric is not None or not parent:
        return metric
    if not clients:
        from hpolab.stores.mlflow_runs import client_for

        clients.append(client_for(stores))
    try:
        return clients[0].get_run(parent).data.params.get("metric")
    except Exception:  # the MLflow store was reset or is elsewhere: the row still stands
        return None


@dataclass
class _Complete:
    """A COMPLETE trial as ranking.front reads it (number, state, values, system attrs, constraints)."""

    number: int
    values: list[float]
    system_attrs: dict

    @property
    def state(self) -> str:
        return "COMPLETE"  # (ranking.py reads a state's name)

    @property
    def constraints(self) -> dict[str, float]:
        from hpolab.stores.optuna_sql import constraints_of

        return constraints_of(self.system_attrs)


@dataclass
class _Counted:
    """A trial as trial_counts.py reads it."""

    number: int
    state: str
    system_attrs: dict


def _rows_from_sql(stores: Stores, data: list, front: Callable[[list, list], list] | None,
                   best: Callable[[list, list], object] | None = None) -> list[StudyRow]:
    """list_studies' rows from optuna_sql.read_studies: the same rows the Optuna reader gives."""
    rows, clients = [], []
    for s in sorted(data, key=lambda s: s.name):
        if is_companion(s.name):
            continue
        multi = len(s.directions) > 1
        complete = [_Complete(n, v, attrs) for n, v, attrs in s.complete]
        top = best(complete, s.directions) if best is not None and not multi else None
        counts = count_trials(_Counted(*t) for t in s.trials)
        on_front = None
        if multi and front is not None and counts["complete"]:
            on_front = len(front(complete, s.directions))
        rows.append(StudyRow(name=s.name, direction="/".join(s.directions), metric=_metric(stores, clients, s.user_attrs),
                             counts=counts, best_value=top.values[0] if top is not None else None, last_activity=s.last_activity,
                             objectives=list(s.metric_names) if multi and s.metric_names else None, front_size=on_front))
    return rows


def _best_value(trials: list, directions: list, best: Callable[[list, list], object] | None) -> float | None:
    """A one-objective study's best value: its best feasible trial of its own (ranking.best's)."""
    top = best(trials, directions) if best is not None and len(directions) == 1 else None
    return top.value if top is not None else None


def delete_study(name: str, stores: Stores) -> Deleted:
    """Remove study `name`: its Optuna study, its MLflow experiment (soft delete) and its local
    folders (<store>/trials/NAME, <store>/lr-find/NAME). Nothing else: other studies, registered
    models and their versions stay.

    MLflow keeps a deleted experiment's name, and `get_or_create_experiment` would restore it,
    runs included, when a study of that name runs again; so the experiment is renamed
    NAME.deleted-<time> first. It stays in MLflow's trash until `mlflow gc` purges it.
    """
    names = study_names(stores)
    if name not in names:
        raise UserError(f"no study named {name!r} in {stores.optuna_shown} (studies there: {', '.join(names) or 'none'})")
    import optuna

    storage = _storage_or_none(stores)
    study = optuna.load_study(study_name=name, storage=storage)
    n_trials = len(study.get_trials(deepcopy=False))
    parent = study.user_attrs.get("mlflow_parent_run_id")

    # MLflow first: if it fails, the Optuna study is still there and the command can be re-run.
    from hpolab.stores.mlflow_runs import client_for
    from hpolab.stores.retired_experiments import retire_experiment

    client = client_for(stores)
    exp = client.get_experiment_by_name(name)
    if exp is None and parent:
        try:
            exp = client.get_experiment(client.get_run(parent).info.experiment_id)
        except Exception:
            exp = None
    exp_id = renamed = None
    if exp is not None:  # renamed even when deleted already (in the UI): retired_experiments.py
        exp_id = exp.experiment_id
        renamed = retire_experiment(client, exp, name)

    optuna.delete_study(study_name=name, storage=storage)
    if name + COMPANION_SUFFIX in {s.study_name for s in storage.get_all_studies()}:
        optuna.delete_study(study_name=name + COMPANION_SUFFIX, storage=storage)

    folders = []
    for d in (stores.trials_dir / name, stores.root / "lr-find" / name):
        if d.is_dir() and stores.root.resolve() in d.resolve().parents:
            shutil.rmtree(d)
            folders.append(d)
    return Deleted(name=name, trials=n_trials, experiment_id=exp_id, experiment_renamed_to=renamed, folders=folders)
