"""The Optuna side of an embedded store with plain SQL, for `study list`, `study status`, `compare`,
`study check` and `report`.

Importing Optuna and opening its RDBStorage (SQLAlchemy's ORM and the alembic version check) costs
about 1.5 s of CPU before the first row is read; `study list` then needs only a few columns of every
trial. So for a SQLite Optuna database whose schema version this module knows, it reads those
columns with sqlite3 in a handful of queries, read-only, without importing Optuna. The other
commands need whole trials: read_study gives Optuna's own FrozenTrial objects, built the way Optuna's
RDBStorage builds them (0.09 s for 1,000 trials instead of 1.0 s). Any other database (PostgreSQL, a
schema Optuna migrated past what is listed in KNOWN_SCHEMAS, a file that cannot be read this way)
returns None, and the caller reads through Optuna as before. tests/test_study_list_sql.py and
tests/test_compare_sql.py check that both readers give the same rows.

A PostgreSQL Optuna storage (a psycopg2 URL) is read with the same queries through pg_read.py: a
team's `study status` of 1,000 trials then costs one connection and a few round trips instead of
Optuna's RDBStorage (tests/test_team_reads.py checks both readers agree there too).

The tables read (Optuna's RDB schema, alembic version v3.2.0.a, as Optuna 5 writes it): studies,
study_directions, study_user_attributes, study_system_attributes, trials, trial_values,
trial_params, trial_intermediate_values, trial_user_attributes, trial_system_attributes.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hpolab.stores import pg_read
from hpolab.stores.pg_read import ReadError
from hpolab.stores.sqlite_read import snapshot
from hpolab.stores.trial_states import IMPORTED, PAUSED, RELEASED, RETRY_HISTORY  # the marks the lifecycle reads (IMPORTED: re-exported)

Source = Path | str  # a SQLite file, or a PostgreSQL URL (pg_read.py)

KNOWN_SCHEMAS = {"v3.2.0.a"}
# system attr of a noise probe's trial (study/sampling/noise_probe.py): the incumbent again on another
# training seed, an extra trial that is never a result (never best, outside n_trials)
NOISE_PROBE = "hpolab.noise_probe"
_INF = {"INF_POS": math.inf, "INF_NEG": -math.inf}
_INTERMEDIATE = {"NAN": math.nan, **_INF}  # an intermediate value may also be NaN
# The trial system attrs ranking and counting (trial_counts.py) read: Optuna's constraints (its old
# list, its named ones), IMPORTED, NOISE_PROBE, a retry copy's history and a released trial's mark
# (failure: a failed trial's reason and last output, study/trials/trial_output.py; tie_break: a COMPLETE
# trial's loss, which breaks a tie on the study metric: study/objectives/ranking.py)
_MARKS = ("constraints", IMPORTED, NOISE_PROBE, RETRY_HISTORY, RELEASED, PAUSED, "hpolab.failure", "hpolab.tie_break")  # (stores/trial_states.py reads them)
_RANKING_KEYS = f"(key IN ({', '.join(repr(k) for k in _MARKS)}) OR key LIKE 'constraints:%')"


def ranking_attrs(system_attrs: dict[str, Any]) -> dict[str, Any]:
    """The system attrs ranking and counting read (what the SQL readers fetch), from a trial's full set."""
    return {k: v for k, v in system_attrs.items() if k in _MARKS or k.startswith("constraints:")}


def constraints_of(system_attrs: dict[str, Any]) -> dict[str, float]:
    """As Optuna's FrozenTrial.constraints: its old list (keys "0", "1", ...), then named ones."""
    out = {str(i): c for i, c in enumerate(system_attrs.get("constraints") or [])}
    out.update({k[len("constraints:"):]: v for k, v in system_attrs.items() if k.startswith("constraints:")})
    return out


def _known_schema(con: sqlite3.Connection) -> bool:
    row = con.execute("SELECT version_num FROM alembic_version").fetchone()
    return row is not None and row[0] in KNOWN_SCHEMAS


def source(url: str) -> Source | None:
    """What these readers read for an Optuna storage URL: a SQLite file's path, a PostgreSQL URL
    (pg_read.py), or None (Optuna reads it)."""
    from hpolab.stores.paths import sqlite_file

    path = sqlite_file(url)
    return path if path is not None else (url if pg_read.is_postgres(url) else None)


def _snapshot(source: Source):
    return snapshot(source, _known_schema) if isinstance(source, Path) else pg_read.snapshot(source, _known_schema)


def _local(stamp: str | datetime | None) -> datetime | None:
    """Optuna 5 stores naive UTC and hands out naive local time (its models.py): so do we. (SQLite
    gives the stamp as text, PostgreSQL as a naive datetime.)"""
    if stamp is None:
        return None
    when = stamp if isinstance(stamp, datetime) else datetime.fromisoformat(stamp)
    return when.replace(tzinfo=timezone.utc).astimezone().replace(tzinfo=None)


@dataclass
class StudyData:
    """What `study list` needs of one study."""

    name: str
    directions: list[str]  # "minimize" | "maximize", by objective
    user_attrs: dict[str, Any]
    metric_names: list[str] | None
    last_activity: datetime | None = None
    complete: list[tuple[int, list[float], dict[str, Any]]] = field(default_factory=list)  # (number, values, system attrs)
    trials: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)  # every trial: (number, state, marks counted)


def read_studies(path: Source) -> list[StudyData] | None:
    """Every study in the Optuna database at `path` (source()), or None when it cannot be read here."""
    try:
        with _snapshot(path) as con:
            return _read(con) if con is not None else None
    except (sqlite3.Error, ReadError, ValueError, KeyError, IndexError, TypeError):  # a locked or odd database: Optuna's reader decides
        return None


def _read(con: sqlite3.Connection) -> list[StudyData]:
    studies = {sid: StudyData(name, [], {}, None) for sid, name in con.execute("SELECT study_id, study_name FROM studies")}
    for sid, direction in con.execute("SELECT study_id, direction FROM study_directions ORDER BY study_id, objective"):
        studies[sid].directions.append(direction.lower())
    for sid, key, value in con.execute("SELECT study_id, key, value_json FROM study_user_attributes"):
        studies[sid].user_attrs[key] = json.loads(value)
    for sid, value in con.execute("SELECT study_id, value_json FROM study_system_attributes WHERE key = 'study:metric_names'"):
        studies[sid].metric_names = json.loads(value)
    for sid, last_start, last_end in con.execute(
            "SELECT study_id, MAX(datetime_start), MAX(datetime_complete) FROM trials GROUP BY study_id"):
        s = studies[sid]
        for stamp in (last_start, last_end):
            if stamp is not None:
                when = _local(stamp)
                s.last_activity = when if s.last_activity is None else max(s.last_activity, when)
    _read_complete(con, studies)
    marks: dict[int, dict[str, Any]] = defaultdict(dict)  # what trial_counts.py reads besides the state
    for tid, key, value in con.execute(f"SELECT trial_id, key, value_json FROM trial_system_attributes WHERE {_RANKING_KEYS}"):
        marks[tid][key] = json.loads(value)
    for tid, sid, number, state in con.execute("SELECT trial_id, study_id, number, state FROM trials ORDER BY trial_id"):
        studies[sid].trials.append((number, state, marks.get(tid, {})))
    return list(studies.values())


def _read_complete(con: sqlite3.Connection, studies: dict[int, StudyData]) -> None:
    """The COMPLETE trials' values and the system attrs ranking reads: constraints (Optuna's old list
    under `constraints`, its named ones under `constraints:<name>`) and a warm start's mark."""
    values: dict[int, dict[int, float]] = defaultdict(dict)
    for tid, objective, value, kind in con.execute(
            "SELECT v.trial_id, v.objective, v.value, v.value_type FROM trial_values v "
            "JOIN trials t ON t.trial_id = v.trial_id WHERE t.state = 'COMPLETE'"):
        values[tid][objective] = _INF.get(kind, value)
    attrs: dict[int, dict[str, Any]] = defaultdict(dict)
    for tid, key, value in con.execute(
            "SELECT trial_id, key, value_json FROM trial_system_attributes WHERE "
            f"trial_id IN (SELECT trial_id FROM trials WHERE state = 'COMPLETE') AND {_RANKING_KEYS}"):
        attrs[tid][key] = json.loads(value)
    for tid, sid, number in con.execute("SELECT trial_id, study_id, number FROM trials WHERE state = 'COMPLETE' ORDER BY trial_id"):
        v = values.get(tid)
        if v:  # (a COMPLETE trial has its values; the snapshot keeps them together)
            studies[sid].complete.append((number, [v[i] for i in sorted(v)], attrs.get(tid, {})))


@dataclass
class TrialRow:
    """What `study status` shows of one trial."""

    number: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    value: float | None  # the first objective's
    params: dict[str, Any]
    steps: int  # the last epoch reported (its highest intermediate step; a retry copy may skip a NaN epoch)
    run_id: str | None
    system_attrs: dict[str, Any]  # constraints and a warm start's mark only

    @property
    def constraints(self) -> dict[str, float]:
        return constraints_of(self.system_attrs)

    @property
    def values(self) -> list[float] | None:  # (as a FrozenTrial's: what ranking.py reads)
        return None if self.value is None else [self.value]


def read_trials(path: Source, name: str) -> tuple[list[str], list[TrialRow]] | None:
    """(directions, trials by number) of study `name`, or None when it cannot be read here (no such
    study, an unknown schema or distribution: the caller reads through Optuna, which says why)."""
    try:
        with _snapshot(path) as con:
            sid = con.execute("SELECT study_id FROM studies WHERE study_name = ?", (name,)).fetchone() if con is not None else None
            if sid is None:
                return None
            directions = [d.lower() for (d,) in con.execute("SELECT direction FROM study_directions WHERE study_id = ? ORDER BY objective", sid)]
            return directions, _trial_rows(con, sid[0]) if len(directions) == 1 else []  # (several: the caller uses Optuna)
    except (sqlite3.Error, ReadError, ValueError, KeyError, IndexError, TypeError):
        return None


def _trial_rows(con: sqlite3.Connection, sid: int) -> list[TrialRow]:
    rows = {tid: TrialRow(number, state, None, {}, 0, None, {}) for tid, number, state in
            con.execute("SELECT trial_id, number, state FROM trials WHERE study_id = ? ORDER BY number", (sid,))}
    where = "trial_id IN (SELECT trial_id FROM trials WHERE study_id = ?)"
    for tid, value, kind in con.execute(f"SELECT trial_id, value, value_type FROM trial_values WHERE objective = 0 AND {where}", (sid,)):
        rows[tid].value = _INF.get(kind, value)
    for tid, pname, pvalue, dist in con.execute(f"SELECT trial_id, param_name, param_value, distribution_json FROM trial_params WHERE {where}", (sid,)):
        rows[tid].params[pname] = _external(pvalue, json.loads(dist))
    for tid, n in con.execute(f"SELECT trial_id, MAX(step) FROM trial_intermediate_values WHERE {where} GROUP BY trial_id", (sid,)):
        rows[tid].steps = n
    for tid, value in con.execute(f"SELECT trial_id, value_json FROM trial_user_attributes WHERE key = 'mlflow_run_id' AND {where}", (sid,)):
        rows[tid].run_id = json.loads(value)
    for tid, key, value in con.execute(
            f"SELECT trial_id, key, value_json FROM trial_system_attributes WHERE {_RANKING_KEYS} AND {where}", (sid,)):
        rows[tid].system_attrs[key] = json.loads(value)
    return sorted(rows.values(), key=lambda r: r.number)


def _external(value: float, dist: dict) -> Any:
    """A parameter's value as Optuna gives it (distribution.to_external_repr); ValueError for a
    distribution this reader does not know (the caller then reads through Optuna)."""
    kind = dist.get("name")
    if kind in ("FloatDistribution", "UniformDistribution", "LogUniformDistribution", "DiscreteUniformDistribution"):
        return value  # (the last three: what older Optuna stored; Optuna reads them as floats)
    if kind in ("IntDistribution", "IntUniformDistribution", "IntLogUniformDistribution"):
        return int(value)
    if kind == "CategoricalDistribution":
        return dist["attributes"]["choices"][int(value)]
    raise ValueError(f"unknown distribution {kind}")


@dataclass
class StudySnapshot:
    """What the analysis commands read of an Optuna Study (name, directions, attrs, trials), from one
    read snapshot. `trials` are Optuna's FrozenTrial, built as Optuna's RDBStorage builds them."""

    study_name: str
    directions: list[Any]  # optuna.study.StudyDirection, by objective
    user_attrs: dict[str, Any]
    metric_names: list[str] | None
    trials: list[Any]  # optuna.trial.FrozenTrial, by number

    def get_trials(self, deepcopy: bool = False, states: Any = None) -> list[Any]:
        return [t for t in self.trials if states is None or t.state in states]


def read_study(path: Source, name: str) -> StudySnapshot | None:
    """Study `name` whole, or None when it cannot be read here (the caller reads through Optuna)."""
    try:
        with _snapshot(path) as con:
            row = con.execute("SELECT study_id FROM studies WHERE study_name = ?", (name,)).fetchone() if con is not None else None
            return _study(con, row[0], name) if row is not None else None
    except (sqlite3.Error, ReadError, ValueError, KeyError, IndexError, TypeError, AssertionError):
        return None


def _study(con: sqlite3.Connection, sid: int, name: str) -> StudySnapshot:
    from optuna.distributions import json_to_distribution
    from optuna.study import StudyDirection
    from optuna.trial import FrozenTrial, TrialState

    directions = [StudyDirection[d] for (d,) in con.execute("SELECT direction FROM study_directions WHERE study_id = ? ORDER BY objective", (sid,))]
    user_attrs = {k: json.loads(v) for k, v in con.execute("SELECT key, value_json FROM study_user_attributes WHERE study_id = ?", (sid,))}
    names = con.execute("SELECT value_json FROM study_system_attributes WHERE study_id = ? AND key = 'study:metric_names'", (sid,)).fetchone()
    where = "trial_id IN (SELECT trial_id FROM trials WHERE study_id = ?)"
    parts: dict[int, dict[str, Any]] = defaultdict(lambda: {"values": {}, "params": {}, "dists": {}, "user": {}, "system": {}, "steps": {}})
    for tid, objective, value, kind in con.execute(f"SELECT trial_id, objective, value, value_type FROM trial_values WHERE {where}", (sid,)):
        parts[tid]["values"][objective] = _INF.get(kind, value)
    dists: dict[str, Any] = {}  # the same distribution JSON, parsed once
    for tid, pname, pvalue, dist in con.execute(f"SELECT trial_id, param_name, param_value, distribution_json FROM trial_params WHERE {where}", (sid,)):
        if dist not in dists:
            dists[dist] = json_to_distribution(dist)
        d = dists[dist]
        parts[tid]["params"][pname], parts[tid]["dists"][pname] = d.to_external_repr(pvalue), d
    for table, part in (("trial_user_attributes", "user"), ("trial_system_attributes", "system")):
        for tid, key, value in con.execute(f"SELECT trial_id, key, value_json FROM {table} WHERE {where}", (sid,)):
            parts[tid][part][key] = json.loads(value)
    for tid, step, value, kind in con.execute(
            f"SELECT trial_id, step, intermediate_value, intermediate_value_type FROM trial_intermediate_values WHERE {where}", (sid,)):
        parts[tid]["steps"][step] = _INTERMEDIATE.get(kind, value)
    trials = []
    for tid, number, state, start, end in con.execute(
            "SELECT trial_id, number, state, datetime_start, datetime_complete FROM trials WHERE study_id = ? ORDER BY number", (sid,)):
        p = parts[tid]
        values = [p["values"][i] for i in sorted(p["values"])] or None
        trials.append(FrozenTrial(number=number, state=TrialState[state], value=None, values=values, datetime_start=_local(start),
                                  datetime_complete=_local(end), params=p["params"], distributions=p["dists"], user_attrs=p["user"],
                                  system_attrs=p["system"], intermediate_values=p["steps"], trial_id=tid))
    return StudySnapshot(name, directions, user_attrs, json.loads(names[0]) if names else None, trials)


def read_study_system_attrs(path: Source, name: str) -> dict[str, Any] | None:
    """Study `name`'s system attrs (its control and notification marks: stores/control.py), or None
    when they cannot be read here (the caller asks the storage)."""
    try:
        with _snapshot(path) as con:
            sid = con.execute("SELECT study_id FROM studies WHERE study_name = ?", (name,)).fetchone() if con is not None else None
            if sid is None:
                return None
            return {k: json.loads(v) for k, v in con.execute("SELECT key, value_json FROM study_system_attributes WHERE study_id = ?", sid)}
    except (sqlite3.Error, ReadError, ValueError, KeyError, IndexError, TypeError):
        return None
