"""A study's control, kept in its Optuna storage: pause, resume, stop and the run controls `study set` changed.

The record is the study system attr `hpolab.control`:

    {"version": 4, "state": "running" | "paused" | "stopped", "stop": "drain" | "now" | None,
     "values": {"n_trials": 60, "parallel": 1, ...}, "change": "set n_trials=60", "by": "ana@box pid 7", "at": ISO time}

Every change writes the whole record with the next version, under the study's budget lock where the
storage has one (stores/budget_lock.py), so two commands at once never reuse a version. `values`
accumulate: a driver applies all of them (idempotent). Each driver that applied a version says so
in its own attr `hpolab.control_applied.<host>:<pid>` = {"version", "at", "worker"}: no two drivers
write the same key. Any storage a study can live in holds it (SQLite, PostgreSQL, the gRPC proxy),
so the control reaches every worker the stores reach; nothing needs a server of its own.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from hpolab.stores.budget_lock import budget_lock

CONTROL_ATTR = "hpolab.control"
APPLIED_PREFIX = "hpolab.control_applied."
STATES = ("running", "paused", "stopped")


@dataclass(frozen=True)
class Control:
    """A study's control record (version 0: never changed)."""

    version: int = 0
    state: str = "running"  # running | paused (no new trials or resumes) | stopped (no driver runs trials)
    stop: str | None = None  # a stop's kind: drain (running trials finish) | now (they stop, resumable)
    values: dict[str, Any] = field(default_factory=dict)  # the run controls `study set` changed, by dotted key
    change: str = ""  # what the last change was, as typed: "pause", "stop --now", "set n_trials=60"
    by: str = ""  # who made it: user@host pid N
    at: str = ""  # when (ISO 8601, UTC)

    @classmethod
    def from_attr(cls, record: Any) -> "Control":
        if not isinstance(record, dict):
            return cls()
        return cls(int(record.get("version", 0)), str(record.get("state", "running")), record.get("stop"),
                   dict(record.get("values") or {}), str(record.get("change", "")), str(record.get("by", "")),
                   str(record.get("at", "")))

    def to_attr(self) -> dict[str, Any]:
        return {"version": self.version, "state": self.state, "stop": self.stop, "values": self.values,
                "change": self.change, "by": self.by, "at": self.at}

    def describe(self) -> str:
        """'paused (v3: pause by ana@box pid 7 at 2026-...)' ('running' when never changed)."""
        if not self.version:
            return "running (never changed)"
        state = f"stopped ({'now' if self.stop == 'now' else 'drain'})" if self.state == "stopped" else self.state
        return f"{state} (v{self.version}: {self.change} by {self.by} at {self.at})"


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def read_control(storage, study_id: int) -> Control:
    return Control.from_attr(storage.get_study_system_attrs(study_id).get(CONTROL_ATTR))


def change_control(storage, study_name: str, change: str, by: str, state: str | None = None, stop: str | None = None,
                   values: dict[str, Any] | None = None) -> Control:
    """Write the next version: `state` (None: unchanged), `stop` (kept only while stopped), `values`
    merged into the run controls set so far. Returns the record written."""
    study_id = storage.get_study_id_from_name(study_name)  # (KeyError: no such study)
    with budget_lock(storage, study_name):
        old = read_control(storage, study_id)
        new_state = state or old.state
        new = Control(old.version + 1, new_state, stop if new_state == "stopped" else None, {**old.values, **(values or {})},
                      change, by, now_iso())
        storage.set_study_system_attr(study_id, CONTROL_ATTR, new.to_attr())
    return new


def applied_key(host: str, pid: int) -> str:
    return f"{APPLIED_PREFIX}{host}:{pid}"


def applied_by(system_attrs: dict[str, Any], version: int) -> list[dict[str, Any]]:
    """The drivers that applied `version` ({"worker", "at", ...}), by when they did."""
    found = [v for k, v in system_attrs.items() if k.startswith(APPLIED_PREFIX) and isinstance(v, dict) and v.get("version") == version]
    return sorted(found, key=lambda v: str(v.get("at", "")))
