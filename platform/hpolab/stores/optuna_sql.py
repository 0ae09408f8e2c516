"""`study list` of an embedded store with plain SQL: no Optuna, no SQLAlchemy (issue 21).

Importing Optuna and opening its RDBStorage (SQLAlchemy's ORM and the alembic version check) costs
about 1.5 s of CPU before the first row is read; `study list` then needs only a few columns of every
trial. So for a SQLite Optuna database whose schema version this module knows, it reads those
columns with sqlite3 in a handful of queries, read-only. Any other database (PostgreSQL, a schema
Optuna migrated past what is listed in KNOWN_SCHEMAS, a file that cannot be read this way) returns
None, and the caller reads through Optuna as before. tests/test_study_list_sql.py checks that both
readers give the same rows.

The tables read (Optuna's RDB schema, alembic version v3.2.0.a, Optuna 4.x-5.x): studies,
study_directions, study_user_attributes, study_system_attributes, trials, trial_values,
trial_system_attributes.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

KNOWN_SCHEMAS = {"v3.2.0.a"}
IMPORTED = "hpolab.imported_from"  # = study/budget.py IMPORTED (a warm start's imported trial)
_INF = {"INF_POS": math.inf, "INF_NEG": -math.inf}


@dataclass
class StudyData:
    """What `study list` needs of one study."""

    name: str
    directions: list[str]  # "minimize" | "maximize", by objective
    user_attrs: dict[str, Any]
    metric_names: list[str] | None
    counts: dict[str, int] = field(default_factory=dict)  # lower-case state -> trials
    last_activity: datetime | None = None
    complete: list[tuple[int, list[float], dict[str, Any]]] = field(default_factory=list)  # (number, values, system attrs)


def read_studies(path: Path) -> list[StudyData] | None:
    """Every study in the SQLite Optuna database at `path`, or None when it cannot be read here."""
    try:
        con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)  # read-only: never creates or migrates
    except sqlite3.Error:
        return None
    try:
        row = con.execute("SELECT version_num FROM alembic_version").fetchone()
        if row is None or row[0] not in KNOWN_SCHEMAS:
            return None
        return _read(con)
    except (sqlite3.Error, ValueError):  # (a locked or odd database: Optuna's reader says what is wrong)
        return None
    finally:
        con.close()


def _read(con: sqlite3.Connection) -> list[StudyData]:
    studies = {sid: StudyData(name, [], {}, None) for sid, name in con.execute("SELECT study_id, study_name FROM studies")}
    for sid, direction in con.execute("SELECT study_id, direction FROM study_directions ORDER BY study_id, objective"):
        studies[sid].directions.append(direction.lower())
    for sid, key, value in con.execute("SELECT study_id, key, value_json FROM study_user_attributes"):
        studies[sid].user_attrs[key] = json.loads(value)
    for sid, value in con.execute("SELECT study_id, value_json FROM study_system_attributes WHERE key = 'study:metric_names'"):
        studies[sid].metric_names = json.loads(value)
    for sid, state, n, last_start, last_end in con.execute(
            "SELECT study_id, state, COUNT(*), MAX(datetime_start), MAX(datetime_complete) FROM trials GROUP BY study_id, state"):
        s = studies[sid]
        s.counts[state.lower()] = n
        for stamp in (last_start, last_end):
            if stamp is not None:
                when = datetime.fromisoformat(stamp)
                s.last_activity = when if s.last_activity is None else max(s.last_activity, when)
    _read_complete(con, studies)
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
            "SELECT a.trial_id, a.key, a.value_json FROM trial_system_attributes a JOIN trials t ON t.trial_id = a.trial_id "
            f"WHERE t.state = 'COMPLETE' AND (a.key IN ('constraints', '{IMPORTED}') OR a.key LIKE 'constraints:%')"):
        attrs[tid][key] = json.loads(value)
    for tid, sid, number in con.execute("SELECT trial_id, study_id, number FROM trials WHERE state = 'COMPLETE' ORDER BY trial_id"):
        v = values.get(tid, {})
        studies[sid].complete.append((number, [v[i] for i in sorted(v)], attrs.get(tid, {})))
