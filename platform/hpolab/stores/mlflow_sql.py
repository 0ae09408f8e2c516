"""The MLflow runs `compare` and `study check` read, from an embedded store with plain SQL: no MLflow import (issue 21).

Importing MLflow and opening its SQLAlchemy store costs about 4 s of CPU on this machine before a
run is read: more than `compare --top 10` may take in all. For a local `sqlite:///…/mlflow.db` the
few columns these commands need are read here with sqlite3, read-only, in one snapshot: a run's latest
metric values (the `latest_metrics` table: what MLflow's `run.data.metrics` is made of), its tags
and params. MLflow migrates its schema often and mostly by adding tables, so this reader checks the
columns it reads rather than a version; any other store (an MLflow server, PostgreSQL, a schema
without these columns, a file that cannot be read) returns None and the caller uses MlflowClient.
tests/test_compare_sql.py checks that both give the same table.
"""

from __future__ import annotations

import math
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

# table -> the columns read from it
COLUMNS = {
    "experiments": {"experiment_id", "name", "workspace"},
    "runs": {"run_uuid", "experiment_id", "lifecycle_stage", "status", "artifact_uri"},
    "latest_metrics": {"run_uuid", "key", "value", "is_nan"},
    "tags": {"run_uuid", "key", "value"},
    "params": {"run_uuid", "key", "value"},
    "logged_models": {"model_id", "experiment_id", "artifact_location", "lifecycle_stage"},
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
    """MLflow's LoggedModel as far as check reads it."""

    model_id: str
    artifact_location: str


@contextmanager
def _snapshot(path: Path) -> Iterator[sqlite3.Connection | None]:
    """A read-only connection in one transaction; None when the file or its columns are not as expected."""
    if not Path(path).is_file():
        yield None
        return
    con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        con.execute("BEGIN")
        for table, cols in COLUMNS.items():
            if not cols <= {row[1] for row in con.execute(f"PRAGMA table_info({table})")}:
                yield None
                return
        yield con
    finally:
        con.close()


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
            rows = con.execute("SELECT model_id, artifact_location FROM logged_models WHERE experiment_id = ? "
                               "AND lifecycle_stage != 'deleted'", (int(experiment_id),))
            return {m: ModelFacts(m, loc) for m, loc in rows}
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
