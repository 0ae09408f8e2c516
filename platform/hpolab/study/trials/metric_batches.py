"""Epoch metrics gathered per run and written in batches from the upload thread.

An epoch used to cost one MLflow write on the driver's loop (a round trip to an MLflow server). Now
the loop only appends the epoch's points (stamped when the driver received them) to the run's batch.
An epoch arriving FLUSH_S seconds or more after the run's last write hands the batch to the upload
thread (uploads.py) as one `log_batch` job at once (epochs longer than FLUSH_S: each is written as it
comes); a batch is also handed over before any other job of that run is queued (a checkpoint upload,
the model, the close), so FIFO order keeps a run's metrics ahead of everything that reads them.

So a run makes at most one metrics write per FLUSH_S seconds of training plus one at its end,
however many epochs: short epochs share a write. The cost: a driver SIGKILLed mid-trial may leave up to FLUSH_S seconds of
that run's last epochs unwritten (like a checkpoint upload still queued); the next driver writes
them into that run from the trial's last.pt and Optuna before closing it (study/state/metric_backfill.py,
tagged hpolab.metrics_restored), and a retry run carries every epoch over (tracker.carry_over_history).
HPOLAB_METRICS_FLUSH_S sets FLUSH_S (0: every epoch is its own job, as soon as it arrives).
"""

from __future__ import annotations

import os
import time

from mlflow.entities import Metric

FLUSH_S = 2.0  # seconds between a run's metric writes while epochs are shorter than that


def flush_seconds() -> float:
    """FLUSH_S, or HPOLAB_METRICS_FLUSH_S (read when a driver starts, not at import)."""
    return float(os.environ.get("HPOLAB_METRICS_FLUSH_S", FLUSH_S))


class MetricBatches:
    """Per run: the points not handed to the upload thread yet, and when its last batch was."""

    def __init__(self, flush_s: float | None = None):
        self.flush_s = flush_seconds() if flush_s is None else flush_s
        self._points: dict[str, list[Metric]] = {}
        self._last: dict[str, float] = {}  # run id -> time.monotonic() of its start or last batch

    def start(self, run_id: str) -> None:
        self._last[run_id] = time.monotonic()

    def add(self, run_id: str, step: int, metrics: dict[str, float]) -> list[Metric]:
        """Append one step's metrics (timestamp now, ms; numbers only); the points appended."""
        ts = int(time.time() * 1000)
        points = [Metric(k, float(v), ts, step) for k, v in metrics.items() if isinstance(v, (int, float))]
        self._points.setdefault(run_id, []).extend(points)
        return points

    def due(self, run_id: str) -> bool:
        """Whether the run's batch should be written now (FLUSH_S since its start or last batch)."""
        return time.monotonic() - self._last.get(run_id, float("-inf")) >= self.flush_s

    def take(self, run_id: str) -> list[Metric]:
        """The run's batch (emptied here); [] when nothing waits."""
        self._last[run_id] = time.monotonic()
        return self._points.pop(run_id, [])

    def forget(self, run_id: str) -> None:
        self._points.pop(run_id, None)
        self._last.pop(run_id, None)

    def runs(self) -> list[str]:
        return list(self._points)
