"""The last epochs a killed driver never wrote to a finished trial's run, written by the next driver.

Epoch metrics reach MLflow in batches from the upload thread (study/trials/metric_batches.py); the
driver tells Optuna a trial's end before it hands the last batch (and the run's close) to that
thread. A driver SIGKILLed in between leaves Optuna with every epoch and the run without its last
ones. The points are not lost: the trial's checkpoint (last.pt in its trial folder, else the copy
uploaded to the run's checkpoints/) holds the whole per-epoch `history` -- retention deletes last.pt
only after the run's close, which never came -- and Optuna's intermediate values are the study
metric's epochs. Before such a run is closed (repair.py), every (metric, epoch) point it lacks is
logged in one log_batch and the run is tagged `hpolab.metrics_restored` saying which epochs and
from where. The same for the run of an attempt reaped because its driver died mid-trial (its last
FLUSH_S seconds of epochs were never written; its retry copy's run gets them by carry-over anyway).
And for the still open run of a trial scheduler's segment put back to paused (driver/pauses.py): up
to its checkpoint's epoch only (the epochs after it are trained again).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from optuna.trial import FrozenTrial

TAG = "hpolab.metrics_restored"


def checkpoint_history(trial_dir: Path | None, tracking_uri: str | None, run_id: str) -> list[dict] | None:
    """The checkpoint's per-epoch history: the trial folder's last.pt (never older than its upload),
    else the run's uploaded checkpoints/last.pt; None when neither can be read."""
    from hpolab.train.checkpoint import load_checkpoint

    local = trial_dir / "last.pt" if trial_dir is not None else None
    if local is not None and local.is_file():
        try:
            return list(load_checkpoint(local, map_location="cpu").get("history") or [])
        except Exception:
            pass  # (a partial file: try the uploaded copy)
    if not tracking_uri:
        return None
    from hpolab.stores.artifacts import fetch_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="hpolab-backfill-"))
    try:
        last = fetch_checkpoint(tracking_uri, run_id, tmp)
        return None if last is None else list(load_checkpoint(last, map_location="cpu").get("history") or [])
    except Exception:
        return None  # an unreachable or unreadable upload: Optuna's values still restore the study metric
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def missing_points(client, run_id: str, trial: FrozenTrial, metric: str | None,
                   history: list[dict] | None, up_to: int | None = None) -> tuple[list, str, set[int] | None]:
    """The points the run lacks (checkpoint history first; the study metric's values from Optuna,
    which are its truth), where they came from ("last.pt", "Optuna", or both), and the steps of
    `metric` the run has (None: not read, no point of it was wanted)."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    wanted: dict[tuple[str, int], tuple[float, int, str]] = {}  # (key, step) -> (value, timestamp ms, source)
    for h in history or []:
        step = int(h["epoch"])
        ts = int(h["timestamp"]) if _number(h.get("timestamp")) else now  # (the routine stamps none today)
        for k, v in h.items():
            if k not in ("epoch", "timestamp") and _number(v):
                wanted[(k, step)] = (float(v), ts, "last.pt")
    if metric:
        for step, v in trial.intermediate_values.items():
            ts = wanted.get((metric, step), (None, now))[1]
            source = "last.pt" if (metric, step) in wanted else "Optuna"
            wanted[(metric, int(step))] = (float(v), ts, source)
    if up_to is not None:  # (a segment put back to paused: the epochs after its checkpoint are trained again)
        wanted = {ks: v for ks, v in wanted.items() if ks[1] <= up_to}
    have: dict[str, set[int]] = {}
    for key in {k for k, _ in wanted}:  # one request per metric: this runs only to repair a killed driver's run
        have[key] = {m.step for m in client.get_metric_history(run_id, key)}
    points, sources = [], set()
    for (key, step), (value, ts, source) in sorted(wanted.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if step not in have[key]:
            points.append(Metric(key, value, ts, step))
            sources.add(source)
    return points, " and ".join(sorted(sources, key=lambda s: s != "last.pt")), have.get(metric)


def backfill_run(client, run_id: str, trial: FrozenTrial, metric: str | None, trial_dir: Path | None,
                 tracking_uri: str | None, history: list[dict] | None = None, up_to: int | None = None,
                 note=None) -> dict[str, str]:
    """Log every epoch point the run lacks (`up_to`: only those up to that epoch); the tag for its
    close ({} when nothing was missing). `history`: the checkpoint's, when the caller read it already.
    With `note`, a backfill that fails is noted and never stops the close that follows ({} returned)."""
    return backfill_and_last_step(client, run_id, trial, metric, trial_dir, tracking_uri, history, up_to, note)[0]


def backfill_and_last_step(client, run_id: str, trial: FrozenTrial, metric: str | None, trial_dir: Path | None,
                           tracking_uri: str | None, history: list[dict] | None = None, up_to: int | None = None,
                           note=None) -> tuple[dict[str, str], int | None]:
    """backfill_run's tag, and the last step of `metric` the run has once it is done (0: none; None:
    not known: the metric's history was not read, or the backfill failed and was noted): a segment
    put back to paused (driver/pauses.py) does not log those epochs again, and the backfill has just
    read the metric's history."""
    try:
        return _backfill(client, run_id, trial, metric, trial_dir, tracking_uri, history, up_to)
    except Exception as e:
        if note is None:
            raise
        note(f"trial {trial.number}: could not restore its run's unwritten epochs: {type(e).__name__}: {e}")
        return {}, None


def _backfill(client, run_id, trial, metric, trial_dir, tracking_uri, history, up_to) -> tuple[dict[str, str], int | None]:
    if history is None:
        history = checkpoint_history(trial_dir, tracking_uri, run_id)
    points, source, have = missing_points(client, run_id, trial, metric, history, up_to)
    last = None if have is None else max(have | {p.step for p in points if p.key == metric}, default=0)
    if not points:
        return {}, last
    from hpolab.stores import mlflow_runs as tr

    tr.log_metrics(client, run_id, points)
    steps = sorted({p.step for p in points})
    span = f"epoch {steps[0]}" if len(steps) == 1 else f"epochs {steps[0]}-{steps[-1]}"
    return {TAG: f"{span} from {source}"}, last


def closing_with_backfill(close_run, client, study, stores, note):
    """`close_run` (run id, state, tags) for a reaped attempt's run (heartbeat.reap_trial): its
    killed driver's unwritten epochs are logged first. A backfill that fails never stops the close."""

    def close(run_id: str, state, tags: dict[str, str]) -> None:
        trial = next((t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("mlflow_run_id") == run_id), None)
        if trial is not None and client.get_run(run_id).info.status == "RUNNING":  # (its owner closed it: all written)
            tags = {**tags, **backfill_run(client, run_id, trial, study.user_attrs.get("metric"),
                                           stores.trial_dir(study.study_name, trial.number), stores.tracking_uri, note=note)}
        close_run(run_id, state, tags)

    return close
