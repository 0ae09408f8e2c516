"""What `study check` reads of a study's live logged models beyond their ids: name, tags, params and
linked metrics (model_links.py). With plain SQL for an embedded store (as mlflow_sql.py reads runs:
no MLflow import), else from the LoggedModel entities MlflowClient gives."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from hpolab.stores.sqlite_read import has_columns, snapshot

COLUMNS = {"logged_models": {"model_id", "experiment_id", "name", "lifecycle_stage"},
           "logged_model_tags": {"model_id", "tag_key", "tag_value"},
           "logged_model_params": {"model_id", "param_key", "param_value"},
           "logged_model_metrics": {"model_id", "metric_name", "metric_value", "metric_step", "metric_timestamp_ms"}}


@dataclass
class ModelLinks:
    name: str
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # key -> the latest linked value


def read_sql(path: Path, experiment_id: str) -> dict[str, ModelLinks] | None:
    """Model id -> its links, for the experiment's live models; None when the file cannot be read here."""
    live = "SELECT model_id FROM logged_models WHERE experiment_id = ? AND lifecycle_stage != 'deleted'"
    try:
        with snapshot(path, has_columns(COLUMNS)) as con:
            if con is None:
                return None
            exp = (int(experiment_id),)
            out = {m: ModelLinks(name) for m, name in con.execute(f"SELECT model_id, name FROM logged_models WHERE model_id IN ({live})", exp)}
            for table, key, value, into in (("logged_model_tags", "tag_key", "tag_value", "tags"),
                                             ("logged_model_params", "param_key", "param_value", "params")):
                for m, k, v in con.execute(f"SELECT model_id, {key}, {value} FROM {table} WHERE model_id IN ({live})", exp):
                    getattr(out[m], into)[k] = v
            for m, k, v in con.execute("SELECT model_id, metric_name, metric_value FROM logged_model_metrics WHERE model_id IN "
                                       f"({live}) ORDER BY metric_step, metric_timestamp_ms", exp):
                out[m].metrics[k] = v
            return out
    except (sqlite3.Error, ValueError, TypeError):
        return None


def from_models(models: Iterable) -> dict[str, ModelLinks]:
    """The same from MLflow's LoggedModel entities (search_logged_models)."""
    out = {}
    for m in models:
        metrics: dict[str, float] = {}
        for point in sorted(m.metrics or [], key=lambda p: (p.step, p.timestamp)):
            metrics[point.key] = point.value
        out[m.model_id] = ModelLinks(m.name, dict(m.tags or {}), dict(m.params or {}), metrics)
    return out
