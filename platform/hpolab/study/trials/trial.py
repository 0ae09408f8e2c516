"""The trial process's one job: an experiment's `train(config, trial)`, with the Trial it talks to.

Every trial runs a `train(config, trial)`: the experiment's own loop, or the platform's routine over
the experiment's data, model and task (train/builtin.py), which is a user of this same object. The
messages to the driver (trial_process.py):

    trial.report(epoch, metrics)   -> ("epoch", epoch, metrics), then reads "continue" | "stop"
    train() returned               -> ("done", summary): best value and epoch over the reports
    train() raised                 -> ("fail", details): that trial only (trial_process.report)

A report's checkpoint is written before the epoch is sent: the file the driver stages for upload
before it answers is exactly that epoch. A study that may prune waits for each answer; one that
cannot (no pruner) writes, sends and reads the answer on a thread while the loop trains its next
epoch, and a stop is seen one report later (reports.py).

trial.checkpoint(state) writes last.pt in the one checkpoint layout (train/checkpoint.py: the
trial's record, "epoch", "history", best..., and the loop's "state"), the layout fit() writes, so a
retry's carry-over (tracker.carry_over_history), uploads, retention and resume read every trial's
alike. The checkpoint of a best epoch is also best.pt. A loop that writes its checkpoints itself
(the routine: its state holds every RNG stream, so a resume is exact) reports that file instead:
`trial.report(epoch, metrics, checkpoint=path)`.

What only some loops do is their function's attributes, never a branch on which loop it is:
`sets_up_before_go` (its set-up writes nothing: it builds data and model while the driver records
the segment's start, and waits for "go" at its first report; any other loop is started after "go"),
`polls_stop` (it asks `trial.stop_requested()` between batches: its reports never wait for the
driver's answer, and a stop abandons the epoch in progress).
"""

from __future__ import annotations

import copy
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from hpolab.study.trials.config_changes import ConfigChanges
from hpolab.study.trials.lifeline import ORPHAN_EXIT_CODE
from hpolab.study.trials.trial_contract import (ContractError, EpochNumbers, TrialFailure, check_plain, model_example,
                                                   plain_metrics, plain_params)
from hpolab.study.trials.reports import Reports
from hpolab.study.trials.stop_interrupt import interrupter
from hpolab.study.trials.stop_interrupt import run as run_train
from hpolab.train.checkpoint import (CHECKPOINT_FORMAT, atomic_write_bytes, link_or_write, load_checkpoint, serialize_checkpoint,
                                     unwrap_model)
from hpolab.train.device import resolve_device
from hpolab.train.state import LoopState

__all__ = ["Trial", "TrialFailure", "run_trial"]


class Trial:
    """What `train(config, trial)` talks to (docs/how-to/own-loop.md): report, checkpoint, restore, log_model."""

    def __init__(self, conn, job: dict[str, Any], *, awaiting_go: bool = False, pipelined: bool = False):
        cfg = job["config"]
        self.number: int = int(job.get("number", -1))
        self.params: dict[str, Any] = dict(job.get("params") or {})
        self.config: dict[str, Any] = cfg
        self.device: torch.device = resolve_device(cfg["trainer"].get("device", "auto"))
        self.dir: Path = Path(job["checkpoint_dir"])
        self._conn = conn
        self._awaiting_go = awaiting_go  # the driver's "go" is read before the first message (trial_process.await_go)
        # The driver's runner says whether reports may go on while the loop trains (no pruner); a loop that polls does.
        # One that does not is interrupted in its epoch by a stop (stop_interrupt.py).
        self._reports = Reports(conn, pipelined or bool(job.get("pipelined_reports")),
                                on_stop=None if pipelined or not job.get("pipelined_reports") else interrupter())
        self._described: dict[str, Any] = {}  # what the loop said of itself for the summary (describe)
        self.keeps_model = bool(job.get("export_model"))  # the study logs models: trial.log_model's copy is saved
        self._metric, self._direction = cfg["metric"], cfg["direction"]
        self._loop = LoopState()  # the routine's bookkeeping of epochs and the best one
        self._epochs = EpochNumbers()  # how the loop counts its epochs (from 0 or from 1)
        self._best_path: Path | None = None  # best.pt, when the best epoch was checkpointed
        self._last_path: Path | None = None
        self._last_epoch = 0  # the epoch last.pt holds
        self._model: torch.nn.Module | None = None
        self._example: torch.Tensor | None = None
        self._model_epoch = 0  # the reported epoch whose weights trial.log_model kept
        # The epoch of the weights the loop's model holds when it is not the last reported one: the
        # Hugging Face callback sets it when the Trainer loaded its best checkpoint at the end.
        self.weights_epoch: int | None = None
        self._changes = ConfigChanges(cfg, None, job.get("scheduler_keys") or ())
        self.resume_path: Path | None = None  # the checkpoint this attempt resumes from (None: a first attempt)
        # That checkpoint as read (once): its record (epoch, history, config, ...) and its "state", which
        # restore() gives; a loop that needs the record too (the routine's fit) takes it from here.
        self.resume_checkpoint: dict[str, Any] | None = None
        if job.get("resume_from"):
            self._resume(Path(job["resume_from"]))
        self.start_epoch: int = self._epochs.loop_epoch(self._loop.epoch + 1)

    # ---------------------------------------------------------------- what train() calls

    def report(self, epoch: Any, metrics: dict[str, float] | None = None, checkpoint: dict[str, Any] | Path | None = None) -> bool:
        """Send this epoch's metrics (after saving `checkpoint`: a state dict, or the path of the file
        the loop wrote itself for this epoch): True = stop now (reports.py says when the answer is this
        epoch's and when the previous one's). `trial.report(metrics)` reports the epoch after the last one."""
        if metrics is None and isinstance(epoch, dict):
            epoch, metrics = None, epoch
        self._go()  # (a loop set up before "go" that reports without asking stop_requested first)
        self._reports.settle()  # the previous report's write, message and answer (pipelined)
        if self._reports.stopped:
            return True
        recorded = self._epochs.record(epoch, self._loop.epoch, self.start_epoch)
        values = plain_metrics(metrics)
        self._changes.check_read()  # a trial scheduler's changes the loop never looked at: refused
        self._loop.record(recorded, values, values.get(self._metric, math.nan), self._direction, 0.0)
        if isinstance(checkpoint, (str, Path)):
            self._written(Path(checkpoint))
            checkpoint = None
        write = self._writer(checkpoint) if checkpoint is not None else None  # (checked and serialized now)
        self._reports.send(recorded, values, write)
        return self._reports.stopped

    def stop_requested(self, wait: bool = False) -> bool:
        """Whether the driver answered "stop" to a report (a loop that polls between batches: a stop
        abandons the epoch in progress). wait: the answer to the last report first."""
        self._go()
        if wait:
            self._reports.settle()
        return self._reports.stopped

    def describe(self, **fields: Any) -> None:
        """What the summary says of this trial beyond its reports (the routine: its device and AMP
        mode, notes, why it stopped, and that its model is rebuilt from best.pt: model_from_checkpoint)."""
        self._described.update(fields)

    def _written(self, last: Path) -> None:
        """The loop wrote this epoch's checkpoint itself: last.pt, and best.pt beside it when the epoch is the best."""
        self._last_path, self._last_epoch = last, self._loop.epoch
        if self.is_best and (last.parent / "best.pt").is_file():
            self._best_path = last.parent / "best.pt"

    def _go(self) -> None:
        if self._awaiting_go:
            self._awaiting_go = False
            await_go(self._conn)

    @property
    def is_best(self) -> bool:
        """Whether the last reported epoch is the best so far (call trial.log_model then to keep its weights)."""
        return bool(self._loop.epoch and self._loop.best_epoch == self._loop.epoch)

    def checkpoint(self, state: dict[str, Any]) -> None:
        """last.pt (and best.pt when the last reported epoch is the best so far), written atomically."""
        self._go()
        self._reports.settle()  # a report's write in flight goes first
        self._writer(state)()

    def settle(self, raise_error: bool = True) -> None:
        """Wait for the report in flight (pipelined): before the trial's outcome is sent."""
        self._reports.settle(raise_error)

    def _writer(self, state: dict[str, Any]) -> Callable[[], None]:
        """Check and serialize `state` now (the loop changes its tensors next); the returned call
        writes it as last.pt, and as best.pt when the last reported epoch is the best so far."""
        if not isinstance(state, dict):
            raise ContractError(f"trial.checkpoint takes a dict, got {type(state).__name__}")
        check_plain(state, "state")
        loop = self._loop
        blob = serialize_checkpoint({
            "format_version": CHECKPOINT_FORMAT, "epoch": loop.epoch, "history": loop.history, "state": state,
            "metric": self._metric, "direction": self._direction,
            "best_value": loop.best_value, "best_epoch": loop.best_epoch,
            "epoch_base": self._epochs.base, "config": self.config,  # (how the loop counts; what a resume changed)
        })
        best, epoch = self.is_best, loop.epoch

        def write() -> None:
            self._last_path = atomic_write_bytes(blob, self.dir / "last.pt")
            self._last_epoch = epoch
            if best:
                self._best_path = link_or_write(blob, self._last_path, self.dir / "best.pt")

        return write

    def restore(self) -> dict[str, Any] | None:
        """The state an earlier attempt of this trial checkpointed last (None: a first attempt)."""
        return self.resume_checkpoint["state"] if self.resume_checkpoint is not None else None

    @property
    def config_changes(self) -> dict[str, Any]:
        """What this attempt's config changed from the restored checkpoint's (a trial scheduler's new
        values, a retry's halved batch), {dotted key: new value}; {} for a first attempt."""
        return self._changes.read()

    def apply_config_changes(self, optimizer: torch.optim.Optimizer, schedulers=()) -> list[str]:
        """Give a restored optimizer (and its LR schedulers) this attempt's trainer.lr, weight_decay,
        momentum and betas; the keys applied (config_changes.py)."""
        return self._changes.apply(optimizer, schedulers)

    def log_params(self, params: dict[str, Any]) -> None:
        """Record params on the trial's run (what the loop used that the spec does not say: its optimizer...)."""
        plain = plain_params(params)
        self._go()
        self._reports.settle()  # one message on the pipe at a time
        self._conn.send(("params", plain))

    def log_model(self, model: torch.nn.Module, input_example: torch.Tensor, *, epoch: int | None = None) -> None:
        """The trial's model, from the last reported epoch (or `epoch`, in the loop's numbering): a CPU
        copy now, saved after train() returns (when the study logs models). The trial's value and the
        metrics linked to the logged model are that epoch's."""
        if not self._loop.epoch:
            raise ContractError("trial.log_model before any trial.report: report the epoch the model is from first")
        recorded = self._epochs.recorded_of(epoch) if epoch is not None else self.weights_epoch or self._loop.epoch
        if recorded not in {int(h["epoch"]) for h in self._loop.history}:
            raise ContractError(f"trial.log_model: epoch {epoch if epoch is not None else recorded} was not reported; give the "
                                "epoch the model's weights are from (default: the last reported)")
        copied = copy.deepcopy(unwrap_model(model)).to("cpu").eval() if isinstance(model, torch.nn.Module) else model
        self._example = model_example(copied, input_example)
        self._model, self._model_epoch = copied, recorded

    # ---------------------------------------------------------------- the trial process's side

    def _resume(self, path: Path) -> None:
        self.resume_path = path
        ckpt = load_checkpoint(path, map_location="cpu")
        if ckpt.get("format_version") != CHECKPOINT_FORMAT or "state" not in ckpt:
            raise TrialFailure("resume", f"{path} was not written by hpolab (checkpoint format {ckpt.get('format_version')!r}, "
                                         f"expected {CHECKPOINT_FORMAT}); start a new study or delete the trial's checkpoints")
        for h in ckpt["history"]:
            metrics = {k: v for k, v in h.items() if k != "epoch"}
            self._loop.record(int(h["epoch"]), metrics, metrics.get(self._metric, math.nan), self._direction, 0.0)
        self._loop.epoch = self._last_epoch = int(ckpt["epoch"])
        self._epochs.base = ckpt.get("epoch_base")
        self._changes = ConfigChanges(self.config, ckpt.get("config"), self._changes.scheduler_keys)
        self.resume_checkpoint = ckpt
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

    def _result(self) -> tuple[int, float]:
        """The epoch the trial's result is (its logged model's, else its best by the study metric) and its value."""
        loop = self._loop
        if not self._model_epoch:
            return loop.best_epoch, loop.best_value
        at = next(h for h in loop.history if h["epoch"] == self._model_epoch)
        value = float(at.get(self._metric, math.nan))
        if not math.isfinite(value) and math.isfinite(loop.best_value):
            raise TrialFailure("metric", f"the model given to trial.log_model is epoch {self._epochs.loop_epoch(self._model_epoch)}'s, "
                                         f"whose {self._metric} is {value} (NaN or not reported); log the model of an epoch "
                                         "with a finite value (e.g. when trial.is_best)")
        if self._model_epoch != loop.best_epoch:  # best.pt is the result's checkpoint, or there is none
            (self.dir / "best.pt").unlink(missing_ok=True)
            self._best_path = None
            if self._last_path is not None and self._last_epoch == self._model_epoch and self._last_path.is_file():
                self._best_path = link_or_write(self._last_path.read_bytes(), self._last_path, self.dir / "best.pt")
        return self._model_epoch, value

    def summary(self, pruned_by_train: bool, costs: Callable | None) -> dict[str, Any]:
        """The ("done", summary) of trial_process.train, from the reports; TrialFailure when they
        never carried the study metric (or an objective)."""
        loop, metric = self._loop, self._metric
        if not loop.history:
            raise ContractError(f"train() returned without reporting an epoch; call trial.report(epoch, "
                                f"{{'{metric}': ...}}) after each epoch")
        if not any(metric in h for h in loop.history):
            carried = sorted({k for h in loop.history for k in h if k != "epoch"})
            raise ContractError(f"the reports never carried the study metric {metric}; they carried: "
                                f"{', '.join(carried) or 'no metrics'} (report {metric}, or set the spec's metric: to one of these)")
        stopped = self._reports.stopped or pruned_by_train
        epoch, value = self._result()
        return {
            "best_value": value,
            "best_epoch": epoch,  # the result's epoch (the logged model's)
            "epochs_run": loop.epoch,
            # "returned": the loop ended before trainer.max_epochs by itself (its own early stopping)
            "stop_reason": "stopped_by_caller" if stopped else "max_epochs" if loop.epoch >= self._max_epochs() else "returned",
            "best_checkpoint": str(self._best_path) if self._best_path else None,
            "last_checkpoint": str(self._last_path) if self._last_path else None,
            "last_checkpoint_epoch": self._last_epoch if self._last_path else None,  # (a pause needs its epoch's)
            "amp": "own loop",
            "device": str(self.device),
            "devices": 1,
            "notes": [],
            "objectives": (self._objective_values(epoch, costs, stopped)
                           if self.config.get("objectives") and "objectives" not in self._described else None),
            "model_logged": self.model_logged,
            "model_epoch": self._model_epoch or None,
            "pruned_by_train": pruned_by_train and not self._reports.stopped,  # optuna.TrialPruned raised unasked
            **{k: v for k, v in self._described.items() if not (k == "stop_reason" and stopped)},
        }

    def _max_epochs(self) -> int:
        return int(self.config.get("trainer", {}).get("max_epochs", 0))

    def _objective_values(self, epoch: int, own_costs: Callable | None, stopped: bool) -> dict[str, float]:
        """Every reported metric at the result's epoch, and the cost metrics measured on the logged model.
        A stopped trial (pruned, or interrupted and retried) is told no values: what it reported is
        enough, and a loop that returned at once has logged no model to measure."""
        from hpolab.train.costs import cost_metrics

        at_best = next((h for h in self._loop.history if h["epoch"] == epoch), self._loop.history[-1])
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


def run_trial(conn, job: dict[str, Any], report: Callable, offer_export: Callable, experiment=None) -> None:
    """The trial process's work: the experiment's train(config, trial) (train_of: its own, or the
    routine over its data and model), its result, then its model (when it logged one and the driver
    asks: child_export.offer_export). `experiment`: the module, when the caller has it (else job's)."""
    from hpolab.config.experiment import load_experiment, train_of
    from hpolab.train import seed_everything

    held: dict[str, Trial] = {}

    def work() -> dict[str, Any]:
        exp = experiment if experiment is not None else load_experiment(job["experiment"])
        train = train_of(exp)
        early = bool(getattr(train, "sets_up_before_go", False))
        if not early:  # its set-up is the user's code: it runs once the segment's start is recorded
            await_go(conn)
        trial = held["trial"] = Trial(conn, job, awaiting_go=early, pipelined=bool(getattr(train, "polls_stop", False)))
        cfg = trial.config
        # Seeded before the loop builds its model: its initial weights come from the global RNG, which a
        # forked process would otherwise inherit unseeded (then no trial could be reproduced)
        seed_everything(cfg["seed"], bool(cfg["trainer"].get("deterministic", False)))
        pruned = False
        try:
            run_train(train, cfg, trial)  # (a stop may end it early: stop_interrupt.py)
        except Exception as e:
            trial.settle(raise_error=False)  # nothing else may use the pipe while a report is in flight
            if not _is_trial_pruned(e):
                raise
            pruned = True
        trial.settle()  # the last report's write, message and answer; a failed write fails the trial
        summary = trial.summary(pruned, getattr(exp, "costs", None))
        if job.get("export_model") and trial.model_logged:
            summary["export_in_child"] = True  # this process waits for the driver's "export" | "skip"
        return summary

    summary = report(conn, work, close=False)
    try:
        if summary is not None and summary.get("export_in_child"):
            offer_export(conn, job, summary, save=held["trial"].save_model)
    finally:
        conn.close()


def await_go(conn) -> None:
    """Wait for the driver's "go" (its segment has started); a driver that is gone, or that says
    anything else (it dropped this start), ends the process: it has trained and written nothing."""
    try:
        go = conn.recv()
    except (EOFError, OSError):
        os._exit(ORPHAN_EXIT_CODE)
    if go != "go":
        os._exit(0)


def _is_trial_pruned(error: Exception) -> bool:
    """optuna.TrialPruned, without importing optuna here: a forkserver started afresh (one a notebook's
    run_study starts) has not imported it (~0.2 s a trial), and a loop that raised it has imported it."""
    optuna = sys.modules.get("optuna")
    return optuna is not None and isinstance(error, optuna.TrialPruned)


def _first_tensor(out: Any) -> torch.Tensor:
    """The model's output on the example, for the signature (a tuple's or dict's first tensor)."""
    if isinstance(out, torch.Tensor):
        return out
    items = out.values() if isinstance(out, dict) else out
    return next(t for t in items if isinstance(t, torch.Tensor))
