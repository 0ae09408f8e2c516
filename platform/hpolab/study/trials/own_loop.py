"""An experiment's own training loop in a trial process: `train(config, trial)` with an OwnTrial.

An experiment that defines `train(config, trial)` (and no build_model) brings its own loop; the trial
process calls it instead of building data and model and calling fit(). The messages to the driver
are the routine's (trial_process.py), so the driver cannot tell the two apart except by the summary's
`own_loop`:

    trial.report(epoch, metrics)   -> ("epoch", epoch, metrics), then reads "continue" | "stop"
    train() returned               -> ("done", summary): best value and epoch over the reports
    train() raised                 -> ("fail", details): that trial only (trial_process.report)

A report's checkpoint is written before the epoch is sent: the file the driver stages for upload
before it answers is exactly that epoch. A study that may prune waits for each answer; one that
cannot (no pruner) writes, sends and reads the answer on a thread while the loop trains its next
epoch, and a stop is seen one report later (own_loop_reports.py).

trial.checkpoint(state) writes last.pt as {"own_loop": 1, "epoch", "history", "state", ...}: the
"history" key is the routine's, so a retry's carry-over (tracker.carry_over_history), uploads,
retention and resume work on it unchanged. The checkpoint of a best epoch is also best.pt.
"""

from __future__ import annotations

import collections
import copy
import math
import operator
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from hpolab.study.trials.own_loop_reports import Reports
from hpolab.train.checkpoint import atomic_write_bytes, link_or_write, load_checkpoint, serialize_checkpoint, unwrap_model
from hpolab.train.device import resolve_device
from hpolab.train.state import LoopState

OWN_LOOP_FORMAT = 1  # the value of a checkpoint's "own_loop" key: the layout above
# What torch.load(weights_only=True) reads back (retries load checkpoints as data only, running no code)
# (exact types: it refuses subclasses, numpy's float64 among them)
PLAIN = (str, bytes, int, float, bool, complex, type(None), torch.Tensor, torch.nn.Parameter, torch.dtype, torch.device, torch.Size)


class TrialFailure(Exception):
    """The trial fails with this one line (no traceback: it is the experiment's contract, not a bug)."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


class OwnTrial:
    """What `train(config, trial)` talks to (docs/how-to/own-loop.md): report, checkpoint, restore, log_model."""

    def __init__(self, conn, job: dict[str, Any]):
        cfg = job["config"]
        self.number: int = int(job.get("number", -1))
        self.params: dict[str, Any] = dict(job.get("params") or {})
        self.config: dict[str, Any] = cfg
        self.device: torch.device = resolve_device(cfg["trainer"].get("device", "auto"))
        self.dir: Path = Path(job["checkpoint_dir"])
        self._reports = Reports(conn, bool(job.get("pipelined_reports")))  # the driver's runner says which mode
        self._metric, self._direction = cfg["metric"], cfg["direction"]
        self._loop = LoopState()  # the routine's bookkeeping of epochs and the best one
        self._best_path: Path | None = None  # best.pt, when the best epoch was checkpointed
        self._last_path: Path | None = None
        self._model: torch.nn.Module | None = None
        self._example: torch.Tensor | None = None
        self._restored: dict[str, Any] | None = None
        if job.get("resume_from"):
            self._resume(Path(job["resume_from"]))
        self.start_epoch: int = self._loop.epoch + 1

    # ---------------------------------------------------------------- what train() calls

    def report(self, epoch: int, metrics: dict[str, float], checkpoint: dict[str, Any] | None = None) -> bool:
        """Send this epoch's metrics (after saving `checkpoint`): True = stop now (own_loop_reports.py
        says when the answer is this epoch's and when the previous one's)."""
        self._reports.settle()  # the previous report's write, message and answer (pipelined)
        if self._reports.stopped:
            return True
        epoch = _epoch_number(epoch, self._loop.epoch, self.start_epoch)
        values = _plain_metrics(metrics)
        self._loop.record(epoch, values, values.get(self._metric, math.nan), self._direction, 0.0)
        write = self._writer(checkpoint) if checkpoint is not None else None  # (checked and serialized now)
        self._reports.send(epoch, values, write)
        return self._reports.stopped

    def checkpoint(self, state: dict[str, Any]) -> None:
        """last.pt (and best.pt when the last reported epoch is the best so far), written atomically."""
        self._reports.settle()  # a report's write in flight goes first
        self._writer(state)()

    def settle(self, raise_error: bool = True) -> None:
        """Wait for the report in flight (pipelined): before the trial's outcome is sent."""
        self._reports.settle(raise_error)

    def _writer(self, state: dict[str, Any]) -> Callable[[], None]:
        """Check and serialize `state` now (the loop changes its tensors next); the returned call
        writes it as last.pt, and as best.pt when the last reported epoch is the best so far."""
        if not isinstance(state, dict):
            raise TypeError(f"trial.checkpoint takes a dict, got {type(state).__name__}")
        _check_plain(state, "state")
        loop = self._loop
        blob = serialize_checkpoint({
            "own_loop": OWN_LOOP_FORMAT, "epoch": loop.epoch, "history": loop.history, "state": state,
            "metric": self._metric, "direction": self._direction,
            "best_value": loop.best_value, "best_epoch": loop.best_epoch,
        })
        best = bool(loop.epoch and loop.best_epoch == loop.epoch)

        def write() -> None:
            self._last_path = atomic_write_bytes(blob, self.dir / "last.pt")
            if best:
                self._best_path = link_or_write(blob, self._last_path, self.dir / "best.pt")

        return write

    def restore(self) -> dict[str, Any] | None:
        """The state an earlier attempt of this trial checkpointed last (None: a first attempt)."""
        return self._restored

    def log_model(self, model: torch.nn.Module, input_example: torch.Tensor) -> None:
        """The trial's model: a CPU copy now, saved after train() returns (when the study logs models)."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"trial.log_model takes a torch.nn.Module, got {type(model).__name__}")
        self._model = copy.deepcopy(unwrap_model(model)).to("cpu").eval()
        self._example = torch.as_tensor(input_example).detach().to("cpu")

    # ---------------------------------------------------------------- the trial process's side

    def _resume(self, path: Path) -> None:
        ckpt = load_checkpoint(path, map_location="cpu")
        if ckpt.get("own_loop") != OWN_LOOP_FORMAT:
            raise TrialFailure("resume", f"{path} was not written by trial.checkpoint (the experiment changed its "
                                         "training loop?); start a new study or delete the trial's checkpoints")
        for h in ckpt["history"]:
            metrics = {k: v for k, v in h.items() if k != "epoch"}
            self._loop.record(int(h["epoch"]), metrics, metrics.get(self._metric, math.nan), self._direction, 0.0)
        self._loop.epoch = int(ckpt["epoch"])
        self._restored = ckpt["state"]
        self._last_path = path
        for best in (self.dir / "best.pt", path.parent / "best.pt"):  # the best epoch came before the resume
            if self._loop.best_epoch and best.is_file():
                self._best_path = best
                break

    def save_model(self, folder: Path) -> Path:
        """The model trial.log_model kept, as an MLflow model folder in `folder` (child_export.py)."""
        from hpolab.study.trials.child_export import save_model_folder

        with torch.inference_mode():
            out = self._model(self._example)
        return save_model_folder(self._model, folder, self._example.numpy(), _first_tensor(out).float().numpy())

    @property
    def model_logged(self) -> bool:
        return self._model is not None

    def summary(self, pruned_by_train: bool, costs: Callable | None) -> dict[str, Any]:
        """The ("done", summary) of trial_process.train, from the reports; TrialFailure when they
        never carried the study metric (or an objective)."""
        loop, metric = self._loop, self._metric
        if not loop.history:
            raise TrialFailure("metric", f"train() returned without reporting an epoch; call trial.report(epoch, "
                                         f"{{'{metric}': ...}}) after each epoch")
        if not any(metric in h for h in loop.history):
            carried = sorted({k for h in loop.history for k in h if k != "epoch"})
            raise TrialFailure("metric", f"the reports never carried the study metric {metric}; they carried: "
                                         f"{', '.join(carried) or 'no metrics'} (report {metric}, or set the spec's metric: to one of these)")
        stopped = self._reports.stopped or pruned_by_train
        return {
            "best_value": loop.best_value,
            "best_epoch": loop.best_epoch,
            "epochs_run": loop.epoch,
            # "returned": the loop ended before trainer.max_epochs by itself (its own early stopping)
            "stop_reason": "stopped_by_caller" if stopped else "max_epochs" if loop.epoch >= self._max_epochs() else "returned",
            "best_checkpoint": str(self._best_path) if self._best_path else None,
            "last_checkpoint": str(self._last_path) if self._last_path else None,
            "amp": "own loop",
            "device": str(self.device),
            "devices": 1,
            "notes": [],
            "objectives": self._objective_values(costs, stopped) if self.config.get("objectives") else None,
            "own_loop": True,
            "model_logged": self.model_logged,
            "pruned_by_train": pruned_by_train and not self._reports.stopped,  # optuna.TrialPruned raised unasked
        }

    def _max_epochs(self) -> int:
        return int(self.config.get("trainer", {}).get("max_epochs", 0))

    def _objective_values(self, own_costs: Callable | None, stopped: bool) -> dict[str, float]:
        """Every reported metric at the best epoch, and the cost metrics measured on the logged model.
        A stopped trial (pruned, or interrupted and retried) is told no values: what it reported is
        enough, and a loop that returned at once has logged no model to measure."""
        from hpolab.train.costs import cost_metrics

        at_best = next((h for h in self._loop.history if h["epoch"] == self._loop.best_epoch), self._loop.history[-1])
        values = {k: float(v) for k, v in at_best.items() if k != "epoch"}
        if stopped:
            return values
        measured = list(self.config.get("cost_metrics") or [])
        missing = [m for m in self.config["objectives"] if m not in values and m not in measured]
        if missing:
            raise TrialFailure("metric", f"the report of the best epoch ({at_best['epoch']}) did not carry the objective "
                                         f"{', '.join(missing)}; it carried: {', '.join(sorted(values))}")
        if measured:
            if self._model is None:
                raise TrialFailure("metric", f"the objectives {', '.join(measured)} are measured on the model: "
                                             "call trial.log_model(model, input_example) in train()")
            values.update(cost_metrics(measured, self._model, self._example, torch.device("cpu"), own_costs))
        return values


def run_own_loop(conn, job: dict[str, Any], experiment, report: Callable, offer_export: Callable) -> None:
    """The trial process with an own loop: train(config, trial), its result, then its model (when it
    logged one and the driver asks: child_export.offer_export)."""
    from hpolab.train import seed_everything

    held: dict[str, OwnTrial] = {}

    def work() -> dict[str, Any]:
        trial = held["trial"] = OwnTrial(conn, job)
        cfg = trial.config
        # Seeded like the routine's trials: the model's initial weights come from the global RNG
        seed_everything(cfg["seed"], bool(cfg["trainer"].get("deterministic", False)))
        pruned = False
        try:
            experiment.train(cfg, trial)
        except Exception as e:
            trial.settle(raise_error=False)  # nothing else may use the pipe while a report is in flight
            if not _is_trial_pruned(e):
                raise
            pruned = True
        trial.settle()  # the last report's write, message and answer; a failed write fails the trial
        summary = trial.summary(pruned, getattr(experiment, "costs", None))
        if job.get("export_model") and trial.model_logged:
            summary["export_in_child"] = True  # this process waits for the driver's "export" | "skip"
        return summary

    summary = report(conn, work, close=False)
    try:
        if summary is not None and summary.get("export_in_child"):
            offer_export(conn, job, summary, save=held["trial"].save_model)
    finally:
        conn.close()


def _is_trial_pruned(error: Exception) -> bool:
    """optuna.TrialPruned, without importing optuna here: a forkserver started afresh (one a notebook's
    run_study starts) has not imported it (~0.2 s a trial), and a loop that raised it has imported it."""
    optuna = sys.modules.get("optuna")
    return optuna is not None and isinstance(error, optuna.TrialPruned)


def _epoch_number(epoch: Any, last: int, start: int) -> int:
    try:
        n = operator.index(epoch)  # an int (numpy's and 0-d integer tensors too), not a float
    except TypeError:
        n = 0
    if isinstance(epoch, bool) or n < 1:
        raise ValueError(f"trial.report: epoch must be an int >= 1 (1-based), got {epoch!r}")
    if n <= last:
        raise ValueError(f"trial.report: epoch {n} was reported already (the last was {last}); epochs go up, "
                         f"and a resumed attempt starts at trial.start_epoch ({start})")
    return n


def _plain_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    if not isinstance(metrics, dict):
        raise TypeError(f"trial.report: metrics must be a dict of name -> number, got {type(metrics).__name__}")
    out = {}
    for k, v in metrics.items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"trial.report: metric {k!r} is not a number ({type(v).__name__})") from None
    out.pop("epoch", None)  # the epoch is the step, not a metric
    return out


def _check_plain(value: Any, where: str) -> None:
    """Tensors, numbers, strings and containers of them: what a retry can load as data only."""
    if type(value) in (dict, collections.OrderedDict):
        for k, v in value.items():
            _check_plain(k, f"{where} key")
            _check_plain(v, f"{where}[{k!r}]")
    elif type(value) in (list, tuple, set):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
    elif type(value) not in PLAIN:
        raise TypeError(f"trial.checkpoint: {where} is a {type(value).__module__}.{type(value).__name__}; a checkpoint holds "
                        "tensors, numbers, strings and dicts/lists of them (state_dict()s; float() or torch.as_tensor "
                        "for numpy values), which a retry loads as data only")


def _first_tensor(out: Any) -> torch.Tensor:
    """The model's output on the example, for the signature (a tuple's or dict's first tensor)."""
    if isinstance(out, torch.Tensor):
        return out
    items = out.values() if isinstance(out, dict) else out
    return next(t for t in items if isinstance(t, torch.Tensor))
