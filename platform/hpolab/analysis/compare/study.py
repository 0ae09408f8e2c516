"""`hpolab compare NAME`: the trials of one study as a pandas DataFrame, one row per trial.

The Optuna study (state, sampled params, the study metric per epoch, timing) joined with its MLflow
runs (run id, tags such as the fail reason, final metric values); then filtered, sorted best first
and cut to the top K (`select`). The report reads the same table.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import pandas as pd

from hpolab.stores.optuna_sql import NOISE_PROBE
from hpolab.study.objectives.noise import noise_floor
from hpolab.study.objectives.objective_values import VALUES_ATTR
from hpolab.study.objectives import ranking
from hpolab.study.objectives.ranking import primary_direction
from hpolab.stores.trial_states import shown
from hpolab.stores.model_links import study_models
from hpolab.stores.paths import Stores

MODEL_COLUMNS = ("model_id", "model_name", "model_uri")  # the trial's logged model (trial_model)

# Metrics that are better when larger; anything else sorts ascending (losses, seconds, ...).
HIGHER_IS_BETTER = ("acc", "f1", "auc", "precision", "recall", "score", "samples_per_second", "r2", "iou", "map")


@dataclass
class StudyTable:
    """The trials of one study, plus what is needed to read the table."""

    name: str
    metric: str  # the study metric, e.g. val_acc ("value" when the stores do not say)
    direction: str  # "maximize" | "minimize"
    frame: pd.DataFrame  # one row per trial; see study_frame() for the columns
    params: list[str]  # sampled param names, e.g. ["trainer.lr", "model.channels"]
    mlflow_found: bool  # False when the MLflow side is missing (only Optuna data in the frame)
    objectives: list[str] = field(default_factory=list)  # several objectives: rows sort by `rank` (ranking.py)
    objective_directions: list[str] = field(default_factory=list)
    tie: dict[int, float] = field(default_factory=dict)  # trial -> its loss breaking a tie on the study metric (ranking.py)
    noise_floor: float | None = None  # the study's measured noise floor (study/objectives/noise.py): the `tied` column

    @property
    def best_col(self) -> str:
        return f"best_{self.metric}"

    @property
    def final_col(self) -> str:
        return f"final_{self.metric}"


def study_metric(study, client, experiment_id: str | None) -> str:
    """The study metric's name: Optuna does not store it; the parent run's params do."""
    parent_id = study.user_attrs.get("mlflow_parent_run_id")
    for run_id in [parent_id] + [t.user_attrs.get("mlflow_run_id") for t in study.get_trials(deepcopy=False)[:3]]:
        if not run_id or client is None:
            continue
        try:
            metric = client.get_run(run_id).data.params.get("metric")
        except Exception:
            continue
        if metric:
            return metric
    return "value"


def mlflow_runs_by_id(client, experiment_id: str | None) -> dict[str, Any]:
    """Every run of the study's experiment, by run id (one paged search, not one query per trial)."""
    if client is None or experiment_id is None:
        return {}
    from hpolab.stores.mlflow_runs import find_runs

    return {r.info.run_id: r for r in find_runs(client, experiment_id, "")}


def runs_of_trials(client, experiment_id: str | None, trials: Iterable) -> dict[str, Any]:
    """The MLflow runs of these trials only, by run id (one query per 100): what a --top K table or
    the report shows costs K runs, not the whole study's."""
    ids = sorted({t.user_attrs["mlflow_run_id"] for t in trials if t.user_attrs.get("mlflow_run_id")})
    if client is None or experiment_id is None or not ids:
        return {}
    from hpolab.stores.mlflow_runs import runs_by_id

    return runs_by_id(client, experiment_id, ids)


def logged_models(client, experiment_id: str | None) -> dict[str, str] | None:
    """The experiment's logged models that are not deleted, model id -> name (paged: a study that
    keeps every trial's model may have thousands); None when they cannot be read."""
    if client is None or experiment_id is None:
        return None
    try:
        return {m.model_id: m.name for m in study_models(client, experiment_id)}
    except Exception:  # an older server without logged models: the run tags alone say which model
        return None


def trial_model(tags: dict[str, str], models: dict[str, str] | None) -> dict[str, str | None]:
    """The model_id / model_name / model_uri columns of a trial: the logged model its run names (tag
    hpolab.model_id), unless retention deleted it (tag hpolab.model_deleted) or the experiment no
    longer holds it (`models`: the live ones, id -> name): a row never points at a deleted model."""
    model_id = tags.get("hpolab.model_id") or None
    if model_id and ("hpolab.model_deleted" in tags or (models is not None and model_id not in models)):
        model_id = None
    name = (models or {}).get(model_id) if model_id else None
    return {"model_id": model_id, "model_name": name, "model_uri": f"models:/{model_id}" if model_id else None}


def _best(values: Iterable[float], direction: str) -> float | None:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return None
    return max(vals) if direction == "maximize" else min(vals)


def _int_or_none(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _float_or_none(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _trial_row(t, run: tuple[dict, dict] | None, params: list[str], metric: str, direction: str, now: dt.datetime,
               models: dict[str, str] | None) -> dict[str, Any]:
    """One trial's row of study_frame (run: its MLflow run's (tags, metrics), or None)."""
    run_id = t.user_attrs.get("mlflow_run_id")
    tags, run_metrics = run if run is not None else ({}, {})
    steps = sorted(t.intermediate_values.items())
    best = _float_or_none(tags.get(f"hpolab.best_{metric}")) if t.state.name == "COMPLETE" else None
    if best is None and t.state.name == "COMPLETE" and t.values is not None and len(t.values) == 1:
        best = float(t.values[0])
    if best is None and t.state.name in ("COMPLETE", "PRUNED"):  # several objectives: what the trial recorded
        best = _float_or_none((t.user_attrs.get(VALUES_ATTR) or {}).get(metric))
    if best is None:
        best = _best((v for _, v in steps), direction)
    final = _float_or_none(run_metrics.get(metric))
    if final is None and steps:
        final = float(steps[-1][1])
    epochs = _int_or_none(tags.get("hpolab.epochs_run"))
    if epochs is None:
        epochs = len(steps)
    end = t.datetime_complete or (now if t.state.name == "RUNNING" else None)
    duration = (end - t.datetime_start).total_seconds() if (end and t.datetime_start) else None
    row: dict[str, Any] = {"trial": t.number, "state": shown(t)}  # (PAUSED: a trial scheduler's)
    row.update({f"params.{p}": t.params.get(p) for p in params})
    row.update(
        {
            f"best_{metric}": best,
            f"final_{metric}": final,
            "epochs": epochs,
            "pruned_at_epoch": _int_or_none(tags.get("hpolab.pruned_at_epoch")),
            "duration_s": duration,
            "fail_reason": tags.get("hpolab.fail_reason") or t.user_attrs.get("fail_reason") or t.system_attrs.get("fail_reason"),
            "run_id": run_id,
            **trial_model(tags, models),
            "started": t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else None,
            "finished": t.datetime_complete.isoformat(timespec="seconds") if t.datetime_complete else None,
        }
    )
    row.update({f"metrics.{k}": v for k, v in sorted(run_metrics.items())})
    return row


def study_frame(study, client=None, experiment_id: str | None = None, metric: str | None = None,
                only: set[int] | None = None) -> StudyTable:
    """One row per trial of an Optuna study, joined with its MLflow run when there is one.

    Columns: trial, state, params.<name> (the sampled values), best_<metric> (best epoch; the
    trial's value for COMPLETE trials), final_<metric> (last epoch), epochs, pruned_at_epoch,
    duration_s, fail_reason, run_id, model_id / model_name / model_uri (the trial's logged model, none
    once deleted), started, finished, and metrics.<name> for every metric the trial's MLflow run
    logged (its last value). `only`: join the MLflow runs of these trial numbers
    only (the other rows hold what Optuna knows).
    """
    metric = metric or study_metric(study, client, experiment_id)
    trials = study.get_trials(deepcopy=False)
    if only is None:
        runs = mlflow_runs_by_id(client, experiment_id)
    else:
        runs = runs_of_trials(client, experiment_id, [t for t in trials if t.number in only])
    found = bool(runs) if only is None else (client is not None and experiment_id is not None)
    models = logged_models(client, experiment_id) if runs else None
    return table_of(study, metric, {k: (r.data.tags, r.data.metrics) for k, r in runs.items()}, found, models)


def table_of(study, metric: str, runs: dict[str, tuple[dict, dict]], found: bool, models: dict[str, str] | None = None) -> StudyTable:
    """study_frame's table from the runs already read: run id -> (tags, metrics); `found`: whether
    the MLflow side was there to read; `models`: the experiment's live logged models, id -> name."""
    direction = primary_direction(study, metric)
    trials = study.get_trials(deepcopy=False)
    params = sorted({p for t in trials for p in t.params})
    now = dt.datetime.now()
    rows = []
    for t in trials:
        run_id = t.user_attrs.get("mlflow_run_id")
        rows.append(_trial_row(t, runs.get(run_id) if run_id else None, params, metric, direction, now, models))
    objectives = list(study.metric_names or []) if len(study.directions) > 1 else []
    ranks = _pareto_columns(study, trials, rows, objectives) if objectives else []
    floor = None if objectives else noise_floor(study.user_attrs)
    noise = _noise_columns(trials, rows, direction, floor)
    base = ["trial", "state", *ranks, *[f"params.{p}" for p in params], f"best_{metric}", f"final_{metric}", *noise, "epochs",
            "pruned_at_epoch", "duration_s", "fail_reason", "run_id", *MODEL_COLUMNS, "started", "finished"]
    frame = pd.DataFrame(rows)
    if frame.empty:
        frame = pd.DataFrame(columns=base)
    extra = sorted(c for c in frame.columns if c not in base)
    frame = frame[base + extra]
    # Integer columns with gaps (RUNNING trials, no MLflow run) stay integers, not floats.
    for col in ("trial", "epochs", "pruned_at_epoch", *(["rank"] if objectives else [])):
        frame[col] = frame[col].astype("Int64")
    directions = [d.name.lower() for d in study.directions] if objectives else []
    tie = {t.number: v for t in trials if (v := ranking.tie_value(t)) is not None}
    return StudyTable(study.study_name, metric, direction, frame, params, found, objectives, directions, tie, floor)


def _noise_columns(trials, rows: list[dict], direction: str, floor: float | None) -> list[str]:
    """`tied` (with a measured noise floor: "best" for the best trial, "yes" for a COMPLETE trial within
    the noise of it, ranking.within_noise) and `noise_probe` (a noise probe's trial: the incumbent on
    another seed, never a result), added to `rows`; the column names."""
    from hpolab.study.objectives import ranking

    cols = []
    if floor is not None:
        top = ranking.best(trials, [direction])
        results = {t.number for t in ranking.ranked(trials, [direction]) if ranking.feasible(t)}  # (not a probe's, not imported)
        for t, row in zip(trials, rows):
            tied = top is not None and t.number in results and ranking.within_noise(t.values[0], top.value, floor, direction)
            row["tied"] = "best" if top is not None and t.number == top.number else "yes" if tied else ""
        cols.append("tied")
    if any(t.system_attrs.get(NOISE_PROBE) for t in trials):
        for t, row in zip(trials, rows):
            row["noise_probe"] = "yes" if t.system_attrs.get(NOISE_PROBE) else ""
        cols.append("noise_probe")
    return cols


def _pareto_columns(study, trials, rows: list[dict], objectives: list[str]) -> list[str]:
    """Several objectives: `rank` (1 = best, ranking.py's order: Pareto rank, feasible first), `front`
    (yes / knee) and each objective's value, added to `rows`; the column names."""
    from hpolab.study.objectives import ranking

    dirs = ranking.directions_of(study)
    order = {t.number: i for i, t in enumerate(ranking.ranked(trials, dirs), start=1)}
    marks = ranking.front_marks(trials, dirs)
    by_number = {t.number: t for t in trials}
    for row in rows:
        t = by_number[row["trial"]]
        row["rank"] = order.get(t.number)
        row["front"] = marks.get(t.number, "")
        recorded = t.user_attrs.get(VALUES_ATTR) or {}
        for name in objectives:
            row[f"objective.{name}"] = _float_or_none(recorded.get(name))
    return ["rank", "front", *[f"objective.{n}" for n in objectives]]


def top_numbers(study, metric: str, state: str, top: int, also: tuple[str, ...] = ()) -> set[int]:
    """Trial numbers of the `top` best rows (select's order, from Optuna alone), plus every trial
    in the states `also` (e.g. FAIL for the report's failed-trials table)."""
    pre = study_frame(study, None, None, metric)
    numbers = {int(n) for n in select(pre, state=state, top=top)["trial"]}
    return numbers | {int(n) for n, st in zip(pre.frame["trial"], pre.frame["state"]) if st in also}


def load_study_table(name: str, stores: Stores, top: tuple[str, int] | None = None) -> StudyTable:
    """`top` = (state, K): the table of `compare --top K` (sorted by the study metric): only the K
    shown trials' MLflow runs are read. (compare_sql.py reads an embedded store faster.)"""
    from hpolab.stores.optuna_storage import load_study

    study = load_study(name, stores)
    client, experiment_id = None, None
    try:
        client = tracking_client(stores)
        exp = client.get_experiment_by_name(name) if client is not None else None
        experiment_id = exp.experiment_id if client is not None and exp is not None else None
    except Exception:
        client = None  # the MLflow store is unreachable: Optuna's side alone still makes a table
    if top is None:
        return study_frame(study, client, experiment_id)
    metric = study_metric(study, client, experiment_id)
    return study_frame(study, client, experiment_id, metric, only=top_numbers(study, metric, *top))


def tracking_client(stores: Stores):
    """An MlflowClient, or None when the local MLflow database does not exist (reading must not create it)."""
    from hpolab.stores.mlflow_runs import client_for

    if stores.tracking_db is not None and not stores.tracking_db.exists():
        return None
    return client_for(stores)


def resolve_column(frame: pd.DataFrame, key: str) -> str:
    """A column from what a user types: exact, or params.<key>, metrics.<key>, or a unique suffix."""
    from hpolab.errors import UserError

    for candidate in (key, f"params.{key}", f"metrics.{key}"):
        if candidate in frame.columns:
            return candidate
    suffix = [c for c in frame.columns if c.endswith("." + key)]
    if len(suffix) == 1:
        return suffix[0]
    known = ", ".join(c for c in frame.columns if c not in ("state", "fail_reason", "run_id", *MODEL_COLUMNS, "started", "finished"))
    if len(suffix) > 1:
        raise UserError(f"--sort {key} is ambiguous ({', '.join(suffix)}); give the full column name")
    raise UserError(f"--sort {key}: no such column; use one of: {known}")


def _descending(table: StudyTable, col: str) -> bool:
    if col == "rank":
        return False
    if col.startswith("objective.") and col[len("objective."):] in table.objectives:
        return table.objective_directions[table.objectives.index(col[len("objective."):])] == "maximize"
    if col in (table.best_col, table.final_col, f"metrics.{table.metric}"):
        return table.direction == "maximize"
    name = col.rsplit(".", 1)[-1].lower()
    return any(h in name for h in HIGHER_IS_BETTER)


def select(table: StudyTable, state: str = "all", sort: str | None = None, top: int | None = None) -> pd.DataFrame:
    """Filter by state, sort best first (the study metric by default), keep the top K rows."""
    from hpolab.errors import UserError

    df = table.frame
    if state != "all":
        df = df[df["state"] == state.upper()]
    if top is not None and top < 1:
        raise UserError(f"--top must be >= 1, got {top}")
    descending = None
    key = sort
    if sort and ":" in sort:
        key, order = sort.rsplit(":", 1)
        if order not in ("asc", "desc"):
            raise UserError(f"--sort {sort}: write METRIC, METRIC:asc or METRIC:desc")
        descending = order == "desc"
    col = resolve_column(df, key) if key else ("rank" if table.objectives else table.best_col)
    if descending is None:
        descending = _descending(table, col)
    # Missing values (FAIL trials, RUNNING ones) go last; a tie on the study metric goes to the lower loss
    # (ranking.py: recorded when the trial completed), then the trial order.
    tie = df["trial"].map(table.tie).astype(float) if col == table.best_col else pd.Series(0.0, index=df.index)
    df = df.assign(_tie=tie).sort_values([col, "_tie", "trial"], ascending=[not descending, True, True], na_position="last",
                                         kind="stable").drop(columns="_tie")
    if top is not None:
        df = df.head(top)
    return df.reset_index(drop=True)
