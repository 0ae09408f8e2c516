"""What makes a study's logged models comparable in MLflow's Models tab and `search_logged_models`:
a name per trial (and per registered version), the metrics linked to the model (`model_id`), its
params and tags.

A trial's model is named `<study>-trial-<n>`; MLflow refuses `/ : . % " '` in a logged model's name,
so each of those characters of the study name becomes `-` (the exact study and trial are in the
tags `optuna.study` and `hpolab.trial_number`). Its linked metrics are the run's metrics of the epoch
its weights were saved from (the best epoch: the objective values of several objectives are those
too), plus any objective measured after training (cost metrics, logged at the last epoch). They are
re-logged with the run's own timestamp and step, so the run's history gains no duplicate point (MLflow's
metric key is key, timestamp, step and value); `val_*` metrics name the validation split as their
dataset. The serving model is named `<registered model>-v<version>`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterable

MLFLOW_REFUSES = "/:.%\"'"  # mlflow.utils.validation._validate_logged_model_name
LEGACY_NAME = "model"  # what every trial's model was called before: still loads (models:/<id>), not renamed
VAL_DATASET, TEST_DATASET = "val", "test"


def model_name_part(text: str) -> str:
    """`text` with each character MLflow refuses in a logged model's name replaced by `-`."""
    return "".join("-" if c in MLFLOW_REFUSES else c for c in text) or "-"


def trial_model_name(study: str, number: int) -> str:
    return f"{model_name_part(study)}-trial-{number}"


def serving_model_name(registered_model: str, version: int | str) -> str:
    return f"{model_name_part(registered_model)}-v{version}"


def trial_model_tags(study: str, number: int, state: str) -> dict[str, str]:
    return {"hpolab.trial_number": str(number), "hpolab.state": state, "optuna.study": study}


def split_digest(params: dict[str, str], split: str) -> str:
    """A digest naming a data split by what defines it: the run's data params and seed (as logged)."""
    what = {k: v for k, v in params.items() if k.startswith("data.") or k == "seed"}
    return hashlib.sha256(json.dumps({**what, "split": split}, sort_keys=True).encode()).hexdigest()[:16]


def linked(metrics: Iterable, model_id: str, params: dict[str, str]) -> list:
    """The run's metric points as the same points linked to `model_id` (a val_* one with the
    validation split as its dataset; the rest, e.g. train_loss or lr, with none)."""
    from mlflow.entities import Metric

    out = []
    for m in metrics:
        name, digest = (VAL_DATASET, split_digest(params, VAL_DATASET)) if m.key.startswith("val_") else (None, None)
        out.append(Metric(m.key, m.value, m.timestamp, m.step, model_id=model_id, dataset_name=name, dataset_digest=digest))
    return out


def run_points(client, run, step: int, also: Iterable[str] = ()) -> list:
    """The run's metric points at `step` (every key), plus the latest point of each key in `also`
    that has none at that step (an objective measured after training)."""
    points, latest = [], {}
    for key in run.data.metrics:
        history = client.get_metric_history(run.info.run_id, key)
        at = [m for m in history if m.step == step]
        points += at[-1:]
        if not at and key in also and history:
            latest[key] = max(history, key=lambda m: (m.step, m.timestamp))
    return points + list(latest.values())


def points_at(logged: Iterable, step: int, also: Iterable[str] = ()) -> list:
    """run_points from the run's points as they were logged, in order (no read of each key's history)."""
    at, latest = {}, {}
    for m in logged:
        if m.step == step:
            at[m.key] = m  # the last one logged at that step, as run_points takes it
        if m.key in also and (m.key not in latest or (m.step, m.timestamp) >= (latest[m.key].step, latest[m.key].timestamp)):
            latest[m.key] = m
    return list(at.values()) + [m for k, m in latest.items() if k not in at]


def link_trial_metrics(client, run_id: str, model_id: str, epoch: int, objectives: Iterable[str] = (),
                       logged: list | None = None) -> list[str]:
    """Link the run's metrics of `epoch` (and the `objectives` measured later) to the model; their keys.
    `logged`: every point the run was given, in order (the driver has them): no history read back."""
    run = client.get_run(run_id)
    if logged is not None:
        points = points_at(logged, epoch, set(objectives))
    else:
        points = run_points(client, run, epoch, set(objectives))
    if points:
        client.log_batch(run_id, metrics=linked(points, model_id, run.data.params))
    return sorted(m.key for m in points)


def set_changed_tags(client, model, tags: dict[str, str | None]) -> bool:
    """Set (value) or remove (None) the model's tags that differ, in one write; whether anything changed."""
    have = model.tags or {}
    changed = {k: v for k, v in tags.items() if v is not None and have.get(k) != v}
    gone = [k for k, v in tags.items() if v is None and k in have]
    if changed:
        client.set_logged_model_tags(model.model_id, changed)
    for k in gone:
        client.delete_logged_model_tag(model.model_id, k)
    return bool(changed or gone)


def study_models(client, experiment_id: str) -> list:
    """The experiment's live logged models (deleted ones are not listed)."""
    out, token = [], None
    while True:
        page = client.search_logged_models([experiment_id], max_results=1000, page_token=token)
        out += list(page)
        token = page.token
        if not token:
            return out


def trial_model_of(model, study: str) -> int | None:
    """The trial number of one of `study`'s trial models (by its tags and name); None for any other."""
    tags = model.tags or {}
    number = tags.get("hpolab.trial_number", "")
    if tags.get("optuna.study") != study or not number.isdigit() or model.name != trial_model_name(study, int(number)):
        return None
    return int(number)


def link_test_metrics(client, run_id: str, model_ids: Iterable[str], values: dict[str, float], fingerprint: str) -> None:
    """Log promote's test metrics on its run once and link the same points to each model, with the
    test split (`fingerprint`: promote's digest of its inputs and labels) as their dataset."""
    import time

    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    points = [Metric(k, float(v), ts, 0) for k, v in values.items() if isinstance(v, (int, float))]
    client.log_batch(run_id, metrics=points)
    for model_id in model_ids:
        client.log_batch(run_id, metrics=[Metric(m.key, m.value, ts, 0, model_id=model_id, dataset_name=TEST_DATASET,
                                                 dataset_digest=fingerprint[:16]) for m in points])
