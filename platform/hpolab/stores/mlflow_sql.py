"""The MLflow side of an embedded store with plain SQL, for `compare`, `study check` and `report`: no
MLflow import.

Importing MLflow and opening its SQLAlchemy store costs about 4 s of CPU on this machine before a
run is read: more than `compare --top 10` may take in all. For a local `sqlite:///…/mlflow.db` the
few columns these commands need are read here with sqlite3, read-only, in one snapshot: a run's latest
metric values (the `latest_metrics` table: what MLflow's `run.data.metrics` is made of), its tags,
params and status, logged models, a run's metric series, the Model Registry's versions and aliases. MLflow migrates its schema often and mostly by adding tables, so this reader checks the
columns it reads rather than a version; any other store (an MLflow server, PostgreSQL, a schema
without these columns, a file that cannot be read) returns None and the caller uses MlflowClient.
tests/test_compare_sql.py, test_study_check.py and test_report.py check that both readers agree.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from hpolab.stores.sqlite_read import has_columns, snapshot

# table -> the columns read from it
COLUMNS = {
    "experiments": {"experiment_id", "name", "workspace"},
    "runs": {"run_uuid", "experiment_id", "lifecycle_stage", "status", "artifact_uri"},
    "latest_metrics": {"run_uuid", "key", "value", "is_nan"},
    "tags": {"run_uuid", "key", "value"},
    "params": {"run_uuid", "key", "value"},
    "logged_models": {"model_id", "experiment_id", "name", "artifact_location", "lifecycle_stage"},
}


@dataclass
class RunInfo:
    run_id: str
    status: str  # RUNNING, FINISHED, FAILED, KILLED, SCHEDULED
    lifecycle_stage: str  # active, deleted
    artifact_uri: str


@dataclass
class RunData:
    metrics: dict[str, float]  # each metric's latest value
    tags: dict[str, str]
    params: dict[str, str]


@dataclass
class RunFacts:
    """MLflow's Run as far as compare and check read it: run.info.(run_id, status, lifecycle_stage,
    artifact_uri) and run.data.(metrics, tags, params), under MLflow's own names."""

    info: RunInfo
    data: RunData


@dataclass
class ModelFacts:
    """MLflow's LoggedModel as far as check, compare and the report read it."""

    model_id: str
    artifact_location: str
    name: str = ""


# What the report reads besides: the LR range test's metric series and the Model Registry
REPORT_COLUMNS = {
    "metrics": {"run_uuid", "key", "value", "step", "timestamp", "is_nan"},
    "registered_models": {"name", "workspace"},
    "model_versions": {"name", "version", "run_id", "description", "creation_time", "current_stage", "workspace"},
    "model_version_tags": {"name", "version", "key", "value", "workspace"},
    "registered_model_aliases": {"name", "alias", "version", "workspace"},
}


def _snapshot(path: Path, columns: dict[str, set[str]] = COLUMNS):
    """None unless every table has the columns read from it."""
    return snapshot(path, has_columns(columns))


def read_runs(path: Path, experiment: str, run_ids: list[str] | None = None, deleted: bool = False,
              ) -> tuple[str | None, dict[str, RunFacts]] | None:
    """(experiment id, its runs by id) of the experiment named `experiment` (MLflow's default
    workspace): its active runs, deleted ones too with `deleted` (MLflow's ViewType.ALL); `run_ids`:
    only these runs (None: every run). (None, {}) when there is no such experiment; None when the
    file cannot be read here."""
    try:
        with _snapshot(path) as con:
            return _read(con, experiment, run_ids, deleted) if con is not None else None
    except (sqlite3.Error, ValueError, TypeError):
        return None


def read_logged_models(path: Path, experiment_id: str) -> dict[str, ModelFacts] | None:
    """The experiment's logged models that are not deleted (what MLflow's search_logged_models gives)."""
    try:
        with _snapshot(path) as con:
            if con is None:
                return None
            rows = con.execute("SELECT model_id, artifact_location, name FROM logged_models WHERE experiment_id = ? "
                               "AND lifecycle_stage != 'deleted'", (int(experiment_id),))
            return {m: ModelFacts(m, loc, name) for m, loc, name in rows}
    except (sqlite3.Error, ValueError, TypeError):
        return None


def _read(con: sqlite3.Connection, experiment: str, run_ids: list[str] | None, deleted: bool) -> tuple[str | None, dict[str, RunFacts]]:
    row = con.execute("SELECT experiment_id FROM experiments WHERE name = ? AND workspace = 'default'", (experiment,)).fetchone()
    if row is None:
        return None, {}
    stage = "" if deleted else " AND lifecycle_stage = 'active'"
    con.execute("CREATE TEMP TABLE wanted (run_uuid TEXT PRIMARY KEY)")  # (a temp table: the read-only file is not written)
    if run_ids is None:
        con.execute(f"INSERT INTO wanted SELECT run_uuid FROM runs WHERE experiment_id = ?{stage}", row)
    else:
        con.executemany(f"INSERT OR IGNORE INTO wanted SELECT run_uuid FROM runs WHERE run_uuid = ? AND experiment_id = ?{stage}",
                        [(r, row[0]) for r in run_ids])
    runs = {r: RunFacts(RunInfo(r, status, stage_, uri), RunData({}, {}, {})) for r, status, stage_, uri in con.execute(
        "SELECT run_uuid, status, lifecycle_stage, artifact_uri FROM runs WHERE run_uuid IN (SELECT run_uuid FROM wanted)")}
    for run, key, value, is_nan in con.execute("SELECT run_uuid, key, value, is_nan FROM latest_metrics WHERE run_uuid IN (SELECT run_uuid FROM wanted)"):
        runs[run].data.metrics[key] = math.nan if is_nan else float(value)
    for table in ("tags", "params"):
        for run, key, value in con.execute(f"SELECT run_uuid, key, value FROM {table} WHERE run_uuid IN (SELECT run_uuid FROM wanted)"):
            getattr(runs[run].data, table)[key] = value
    return str(row[0]), runs


@dataclass
class VersionFacts:
    """MLflow's ModelVersion as far as the report reads it."""

    name: str
    version: int
    run_id: str | None
    description: str | None
    creation_timestamp: int | None  # ms
    tags: dict[str, str]


@dataclass
class RegistryFacts:
    """One registered model: its aliases (alias -> version) and its versions, newest first (found:
    False when no model is registered for the study)."""

    found: bool
    name: str
    aliases: dict[str, int]
    versions: list[VersionFacts]


def read_run_series(path: Path, experiment_id: str, run_id: str | None, run_name: str, keys: tuple[str, ...],
                    ) -> tuple[str | None, dict[str, dict[int, float]] | None, dict[str, str]] | None:
    """(run id, {metric: {step: value}}, params) of run `run_id`, or else of the experiment's latest
    active run named `run_name` (MLflow's get_metric_history order: a later value of a step wins).
    (None, {}, {}): no run of that name; (run_id, None, {}): no such run; None: the file cannot be
    read here."""
    try:
        with _snapshot(path, {**COLUMNS, **REPORT_COLUMNS}) as con:
            if con is None:
                return None
            if not run_id:
                row = con.execute("SELECT r.run_uuid FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid WHERE r.experiment_id = ? "
                                  "AND r.lifecycle_stage = 'active' AND t.key = 'mlflow.runName' AND t.value = ? "
                                  "ORDER BY r.start_time DESC LIMIT 1", (int(experiment_id), run_name)).fetchone()
                if row is None:
                    return None, {}, {}
                run_id = row[0]
            elif con.execute("SELECT 1 FROM runs WHERE run_uuid = ?", (run_id,)).fetchone() is None:
                return run_id, None, {}
            series: dict[str, dict[int, float]] = {k: {} for k in keys}
            for key, step, value, is_nan in con.execute(
                    f"SELECT key, step, value, is_nan FROM metrics WHERE run_uuid = ? AND key IN ({', '.join('?' * len(keys))}) "
                    "ORDER BY timestamp, step, value", (run_id, *keys)):
                series[key][step] = math.nan if is_nan else float(value)
            params = dict(con.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,)))
            return run_id, series, params
    except (sqlite3.Error, ValueError, TypeError):
        return None


def read_registry(path: Path, name: str, study: str) -> RegistryFacts | None:
    """The registered model `name`, or else the one whose versions carry tag hpolab.study = `study`
    (`promote --model-name`); None when the file cannot be read here."""
    try:
        with _snapshot(path, {**COLUMNS, **REPORT_COLUMNS}) as con:
            if con is None:
                return None
            live = "workspace = 'default' AND current_stage != 'Deleted_Internal'"
            if con.execute("SELECT 1 FROM registered_models WHERE name = ? AND workspace = 'default'", (name,)).fetchone() is None:
                row = con.execute(f"SELECT v.name FROM model_versions v JOIN model_version_tags t ON t.name = v.name AND t.version = v.version "
                                  f"AND t.workspace = v.workspace WHERE v.{live} AND t.key = 'hpolab.study' AND t.value = ? "
                                  "ORDER BY v.creation_time LIMIT 1", (study,)).fetchone()
                if row is None:
                    return RegistryFacts(False, name, {}, [])
                name = row[0]
            aliases = dict(con.execute("SELECT alias, version FROM registered_model_aliases WHERE name = ? AND workspace = 'default'", (name,)))
            versions = {v: VersionFacts(name, v, run, desc, created, {}) for v, run, desc, created in con.execute(
                f"SELECT version, run_id, description, creation_time FROM model_versions WHERE name = ? AND {live}", (name,))}
            for v, key, value in con.execute("SELECT version, key, value FROM model_version_tags WHERE name = ? AND workspace = 'default'", (name,)):
                if v in versions:
                    versions[v].tags[key] = value
            return RegistryFacts(True, name, aliases, sorted(versions.values(), key=lambda v: v.version, reverse=True))
    except (sqlite3.Error, ValueError, TypeError):
        return None
