"""fit(): the shared training routine. Reads top to bottom: check the arguments, set up, restore
(from a checkpoint), then per epoch: train one epoch, evaluate, checkpoint, the caller; the result.

The steps live beside it, each one idea: batches.py (what is trained on), step.py (one optimizer
step: forward, backward, clip, step -- shared with the LR sweep), epoch.py (one training epoch),
evaluation.py + metrics.py (validation), state.py (what carries across epochs, and checkpoints),
nonfinite.py (NaN/inf losses).

It talks to its caller only through arguments and callbacks (`on_epoch`, `log`) and knows nothing
of Optuna or MLflow. Counting conventions used throughout:

- epoch: 1-based, and counts the epochs run before a resume.
- micro_step: forward/backward passes since the start of training (0-based, across epochs and
  resumes). `cfg.inject_oom_at_step` / `cfg.inject_nan_at_step` refer to this index: N means the
  (N+1)-th micro-batch of the run.
- global_step: optimizer steps since the start of training. With grad_accum_steps=k an epoch of m
  micro-batches takes ceil(m / k) optimizer steps (the last group may be partial).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from .batches import Batches, TensorBatches, eval_batches, train_batches
from .checkpoint import unwrap_model
from .config import TrainConfig
from .data import DataSplits
from .device import resolve_amp, resolve_device
from .epoch import EpochTraining, train_epoch
from .evaluation import evaluate_batches
from .nonfinite import LossWatch, check_val_loss
from .optim import LRSchedule, check_trainable_parameters, schedule_from_config
from .seeding import make_generator, seed_everything
from .state import Checkpointed, LoopState, restore, write_checkpoints
from .step import TrainStep, make_train_step
from .tasks import Classification, sample_targets

BASE_METRICS = (
    "train_loss",  # mean training criterion over the epoch's samples (incl. smoothing/weights/focal)
    "val_loss",  # the task's validation loss (classification: plain cross-entropy, comparable across trials whatever the criterion)
    # ... then the task's val_* metrics (classification: val_acc; see train/tasks/), then:
    "lr",  # LR of the first param group at the end of the epoch
    "grad_norm",  # mean global L2 norm of the gradients over the epoch's optimizer steps, before clipping
    "grad_norm_max",
    "epoch_seconds",  # wall seconds, train + validation
    "samples_per_second",  # training samples per second of training time
    "data_wait_fraction",  # share of training time spent waiting for a batch / moving it to the device
)
STOP_REASONS = ("max_epochs", "early_stopping", "stopped_by_caller")

@dataclass
class FitResult:
    best_value: float  # best value of the study metric (nan when no epoch produced a finite one)
    best_epoch: int  # epoch of best_value (1-based; 0 when none)
    epochs_run: int  # completed epochs, including those before a resume
    stop_reason: str  # "max_epochs" | "early_stopping" | "stopped_by_caller"
    history: list[dict[str, float]] = field(default_factory=list)  # per-epoch metrics, each with "epoch"
    last_metrics: dict[str, float] = field(default_factory=dict)  # the last epoch's metrics (no "epoch" key)
    best_checkpoint: Path | None = None  # best.pt holding best_epoch's state, when checkpoints are written
    last_checkpoint: Path | None = None  # last.pt written by this call (or resume_from when none was)
    amp: str = "off"  # the amp mode that ran: off | bf16 | fp16
    device: str = "cpu"


def imbalance_handling_on(cfg: TrainConfig) -> bool:
    return cfg.class_weighting != "none" or cfg.balanced_sampler or cfg.focal_gamma > 0


def epoch_metric_names(cfg: TrainConfig, num_classes: int, task: Any = None) -> list[str]:
    """The keys of each epoch's metrics dict for this config and task (what `metric` may name)."""
    task = task if task is not None else Classification()
    val = [m for m in task.metric_directions(cfg, num_classes) if m != "val_loss"]
    return list(BASE_METRICS[:2]) + val + list(BASE_METRICS[2:])


# ---------------------------------------------------------------- set-up


def _check_arguments(cfg: TrainConfig, data: DataSplits, metric: str, direction: str, resume_from, task) -> None:
    available = epoch_metric_names(cfg, data.num_classes, task)
    if metric not in available:
        raise ValueError(f"metric {metric!r} is not an epoch metric of this run (task {task.name}); "
                         f"available: {', '.join(available)}{task.metric_hint(metric)}")
    problems = task.check_config(cfg)
    if problems:
        raise ValueError("; ".join(problems))
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"direction must be 'maximize' or 'minimize', got {direction!r}")
    if len(data.train) == 0 or len(data.val) == 0:
        raise ValueError(f"the train and val splits must not be empty (train={len(data.train)}, val={len(data.val)})")
    if resume_from is not None and not Path(resume_from).is_file():
        raise FileNotFoundError(f"resume_from: no checkpoint at {resume_from}")
    # Wrong targets for the task fail here, once and clearly, not as an index error deep in a loss.
    task.check_targets(sample_targets(data.train), data.num_classes)


def _place_model(cfg: TrainConfig, model: nn.Module, data: DataSplits, device: torch.device, note, ranks) -> tuple[nn.Module, nn.Module, bool]:
    """(the plain module, what runs forward, channels_last): checked, on the device, DDP-wrapped with
    ranks, compiled if asked."""
    raw_model = unwrap_model(model)  # parameters, state_dicts and checkpoints use the plain module
    if ranks is not None:
        ranks.convert_batchnorm(raw_model, cfg.sync_batchnorm, note)  # before the optimizer sees the parameters
    check_trainable_parameters(raw_model)
    raw_model.to(device)
    channels_last = cfg.channels_last and len(data.input_shape) == 3
    if cfg.channels_last and not channels_last:
        note(f"channels_last ignored: it applies to image inputs (C, H, W), these are {tuple(data.input_shape)}")
    if channels_last:
        raw_model.to(memory_format=torch.channels_last)
    net = model
    if ranks is not None:
        net = ranks.wrap(raw_model)  # DDP over the plain module (compiled below when asked: compile(DDP(m)))
    if cfg.compile and (net is raw_model or ranks is not None):
        net = torch.compile(net)
    return raw_model, net, channels_last


@dataclass
class _Run:
    """What fit() sets up once, before any epoch."""

    net: nn.Module  # what runs forward: the model as given, or torch.compile of it
    channels_last: bool
    train: Batches
    val: Batches
    step: TrainStep
    schedule: LRSchedule
    parts: Checkpointed  # what a checkpoint saves besides LoopState (parts.model: the plain module)
    bound: Any  # the task bound to the data: loss, metrics (train/tasks/)


def _set_up(cfg: TrainConfig, model: nn.Module, data: DataSplits, *, seed: int, direction: str, device: torch.device, amp: str, note, task,
            ranks=None) -> _Run:
    """Model on the device, then data, then loss, optimizer, schedule, scaler (this order: RNG use)."""
    raw_model, net, channels_last = _place_model(cfg, model, data, device, note, ranks)
    generator = make_generator(seed)  # the train split's order (and DataLoader worker seeds)
    dtype = task.target_dtype
    shard = (ranks.rank, ranks.world) if ranks is not None else None  # this rank's share of every batch
    train_data = train_batches(cfg, data, device, generator, note, target_dtype=dtype, shard=shard)
    val_data = eval_batches(data.val, cfg.eval_batch_size, device, cfg.num_workers, seed, target_dtype=dtype)
    steps_per_epoch = math.ceil(len(train_data) / cfg.grad_accum_steps)  # optimizer steps
    bound = task.bind(cfg, data, device)  # class weights / target standardisation from the train split
    step = make_train_step(cfg, data, raw_model, net=net, device=device, amp=amp, lr=cfg.lr, bound=bound)
    if cfg.scheduler == "onecycle" and cfg.warmup_epochs > 0:
        note("warmup_epochs ignored with scheduler=onecycle (OneCycle has its own warm-up)")
    schedule = schedule_from_config(cfg, step.optimizer, steps_per_epoch=steps_per_epoch, direction=direction)
    note(
        f"device={device} amp={amp} compile={cfg.compile} channels_last={channels_last} "
        f"data={'in-memory' if isinstance(train_data, TensorBatches) else f'DataLoader(num_workers={cfg.num_workers})'} "
        f"micro_batches/epoch={len(train_data)} optimizer_steps/epoch={steps_per_epoch} "
        f"effective_batch={cfg.batch_size * cfg.grad_accum_steps} deterministic={cfg.deterministic}"
        + (f" devices={ranks.world} micro_batch_per_device={cfg.batch_size // ranks.world}" if ranks is not None else "")
    )
    parts = Checkpointed(raw_model, step.optimizer, schedule, step.scaler, generator)
    return _Run(net, channels_last, train_data, val_data, step, schedule, parts, bound)


@contextlib.contextmanager
def _explain_nondeterministic_ops(deterministic: bool, device: torch.device) -> Iterator[None]:
    """torch's "no deterministic implementation" error, restated as the fix (a config switch)."""
    try:
        yield
    except RuntimeError as e:
        if deterministic and "deterministic implementation" in str(e):
            raise RuntimeError(
                f"deterministic=true, but an operation of this model has no deterministic implementation on "
                f"{device.type}. Set deterministic=false, or replace the operation. torch: {e}"
            ) from e
        raise


# ---------------------------------------------------------------- per epoch


def _epoch_metrics(trained: EpochTraining, val: dict[str, Any], bound) -> dict[str, float]:
    """The epoch's metrics, in epoch_metric_names order; "lr" and "epoch_seconds" are filled in by the caller."""
    n_norms = float(trained.norms.count)
    metrics: dict[str, float] = {
        "train_loss": float(trained.loss_sum) / trained.samples,
        "val_loss": val["loss"],
        **bound.epoch_metrics(val),
        "lr": math.nan,  # set around the epoch-end scheduler step
        "grad_norm": float(trained.norms.total) / n_norms if n_norms else math.nan,
        "grad_norm_max": float(trained.norms.max) if n_norms else math.nan,
        "epoch_seconds": math.nan,
        "samples_per_second": trained.samples / trained.seconds,
        "data_wait_fraction": trained.data_wait / trained.seconds,
    }
    return metrics


def _step_schedule_at_epoch_end(metrics: dict[str, float], schedule: LRSchedule, optimizer: torch.optim.Optimizer, metric: str) -> None:
    metrics["lr"] = float(optimizer.param_groups[0]["lr"])
    schedule.after_epoch(metrics[metric])  # ReduceLROnPlateau acts here
    metrics["lr"] = float(optimizer.param_groups[0]["lr"])  # the LR the next epoch starts with


def _stop_reason(cfg: TrainConfig, state: LoopState, metric: str, stopped_by_caller: bool, note) -> str | None:
    """Why training stops after epoch `state.epoch` (None: it goes on). The caller's word comes first."""
    if stopped_by_caller:
        return _stopped_by_caller(state, note)
    if cfg.early_stopping_patience is not None and state.bad_epochs >= cfg.early_stopping_patience:
        note(
            f"early stopping after epoch {state.epoch}: {metric} has not improved by more than "
            f"{cfg.early_stopping_min_delta} for {state.bad_epochs} epochs (best {state.best_value:.6g} at epoch {state.best_epoch})"
        )
        return "early_stopping"
    return None


def _stopped_by_caller(state: LoopState, note) -> str:
    note(f"stopped by the caller after epoch {state.epoch}")
    return "stopped_by_caller"


def _resume(cfg: TrainConfig, run: _Run, resume_from, ckpt_dir: Path | None, *, metric: str, direction: str, note,
            loaded: dict[str, Any] | None) -> tuple[LoopState, Path | None]:
    """(loop state, best.pt) restored from `resume_from` (`loaded`: its contents, read already); a fresh
    state when there is none."""
    if resume_from is None:
        return LoopState(), None
    state, best_path = restore(resume_from, run.parts, cfg=cfg, metric=metric, direction=direction, checkpoint_dir=ckpt_dir,
                               note=note, loaded=loaded)
    note(f"resumed at epoch {state.epoch + 1} of {cfg.max_epochs} from {resume_from}")
    return state, best_path


def _on_rank0(ranks, compute: Callable[[], Any]) -> Any:
    """`compute()` in a single process; with ranks, rank 0 computes and every rank gets its result."""
    return compute() if ranks is None else ranks.from_rank0(compute)


def _first_epoch(cfg: TrainConfig, state: LoopState) -> tuple[str, int]:
    """(stop reason if no epoch runs, the first epoch to train) after a restore."""
    if cfg.early_stopping_patience is not None and state.bad_epochs >= cfg.early_stopping_patience:
        return "early_stopping", cfg.max_epochs + 1  # the checkpoint's run had stopped early
    return "max_epochs", state.epoch + 1


def _train_and_evaluate(cfg: TrainConfig, run: _Run, watch: LossWatch, state: LoopState, epoch: int, *, data: DataSplits,
                        device: torch.device, amp: str, metric: str, seed: int, ranks, interrupted=None) -> dict[str, float] | None:
    """One epoch of training, the evaluation (rank 0 with ranks) and the epoch-end schedule step: the epoch's metrics
    (None: `interrupted()` said so during training, and the epoch was abandoned)."""
    if ranks is not None:
        ranks.begin_epoch(run.train, epoch, seed)
    trained = train_epoch(
        cfg, run.step, run.train, run.schedule, watch,
        epoch=epoch, micro_step=state.micro_step, global_step=state.global_step, channels_last=run.channels_last,
        interrupted=interrupted,
    )
    if trained is None:
        return None
    state.micro_step, state.global_step = trained.micro_step, trained.global_step
    if ranks is not None:
        ranks.reduce_training(trained)  # train_loss over every rank's samples

    val = _on_rank0(ranks, lambda: evaluate_batches(run.parts.model if ranks is not None else run.net, run.val, num_classes=data.num_classes,
                                                    device=device, amp=amp, channels_last=run.channels_last, bound=run.bound))
    check_val_loss(val["loss"], epoch=epoch, micro_step=state.micro_step, amp=amp)
    metrics = _epoch_metrics(trained, val, run.bound)
    _step_schedule_at_epoch_end(metrics, run.schedule, run.step.optimizer, metric)
    metrics["epoch_seconds"] = time.perf_counter() - trained.started
    return metrics


def _epochs(cfg: TrainConfig, run: _Run, watch: LossWatch, state: LoopState, first_epoch: int, stop_reason: str, best_path, *,
            data: DataSplits, device: torch.device, amp: str, metric: str, direction: str, seed: int, ranks, ckpt_dir: Path | None,
            on_epoch, stop_requested, note) -> tuple[str, Path | None, Path | None]:
    """fit()'s epochs, from `first_epoch`: train, evaluate, checkpoint, the caller. (stop reason, best.pt, last.pt)."""
    last_path = None
    interrupted = (lambda: stop_requested(False)) if stop_requested is not None else None
    with _explain_nondeterministic_ops(cfg.deterministic, device):
        for epoch in range(first_epoch, cfg.max_epochs + 1):
            metrics = _train_and_evaluate(cfg, run, watch, state, epoch, data=data, device=device, amp=amp, metric=metric, seed=seed,
                                          ranks=ranks, interrupted=interrupted)
            # A pipelined caller's "stop" (to the epoch before) abandons this one: never recorded, never checkpointed.
            if metrics is None or (stop_requested is not None and stop_requested(True)):
                return _stopped_by_caller(state, note), best_path, last_path
            improved = state.record(epoch, metrics, metrics[metric], direction, cfg.early_stopping_min_delta)

            if ckpt_dir is not None and (ranks is None or ranks.is_rank0):
                last_path, best = write_checkpoints(
                    state, run.parts, ckpt_dir, improved=improved, cfg=cfg, metric=metric, direction=direction, amp=amp, device=device
                )
                best_path = best or best_path

            # With ranks: rank 0 asks the caller; every rank gets its answer, so all stop after the same epoch.
            stopped_by_caller = _on_rank0(ranks, lambda: on_epoch is not None and bool(on_epoch(epoch, dict(metrics))))
            reason = _stop_reason(cfg, state, metric, stopped_by_caller, note)
            if reason is not None:
                stop_reason = reason
                break
    if stop_requested is not None and stop_reason != "stopped_by_caller" and stop_requested(True):  # its answer to the last epoch
        stop_reason = _stopped_by_caller(state, note)
    return stop_reason, best_path, last_path


def _fit_result(state: LoopState, stop_reason: str, best_path, last_path, resume_from, *, amp: str, device: torch.device) -> FitResult:
    return FitResult(
        best_value=state.best_value,
        best_epoch=state.best_epoch,
        epochs_run=len(state.history),
        stop_reason=stop_reason,
        history=state.history,
        last_metrics={k: v for k, v in state.history[-1].items() if k != "epoch"} if state.history else {},
        best_checkpoint=best_path,
        # Written by this call; when none was (no checkpoint_dir, or nothing left to train), the resumed one.
        last_checkpoint=last_path if last_path is not None or resume_from is None else Path(resume_from),
        amp=amp,
        device=str(device),
    )


# ---------------------------------------------------------------- fit


def fit(cfg: TrainConfig, model: nn.Module, data: DataSplits, *, metric: str = "val_acc", direction: str = "maximize", seed: int = 0,
        on_epoch: Callable[[int, dict[str, float]], bool] | None = None, checkpoint_dir: str | Path | None = None,
        resume_from: str | Path | None = None, log: Callable[[str], None] | None = None, task: Any = None, ranks: Any = None,
        stop_requested: Callable[[bool], bool] | None = None, resume_checkpoint: dict[str, Any] | None = None) -> FitResult:
    """Train `model` on `data` as `cfg` says; select the best epoch by `metric` (`direction`).

    on_epoch(epoch, metrics) is called after each epoch, once that epoch's checkpoints are written;
    returning True stops training ("stopped_by_caller", e.g. a pruned trial). checkpoint_dir gets
    last.pt every epoch and best.pt when the metric improves. resume_from: a last.pt to continue
    from at its next epoch, bit-for-bit as if never interrupted (same device, same seed, same
    config; with persistent DataLoader workers the workers' own RNG restarts); resume_checkpoint: that
    file's contents when the caller has read it already (load_checkpoint), so it is not read again.
    log receives human-readable notes. Raises NonFiniteLossError on a NaN/inf loss, torch.cuda.OutOfMemoryError
    as torch does (the caller decides whether to retry with a smaller micro-batch).

    "Best" (best_value, best.pt) is any strict improvement of the metric; early stopping counts
    epochs without an improvement larger than cfg.early_stopping_min_delta.
    task: what the outputs and targets mean (train/tasks/; `tasks.task_for(experiment)`); classification
    when None. It owns the loss, the val_* metrics and the target checks.
    ranks: this process's distributed.Ranks when the trial runs on several devices (DDP); every rank
    calls fit() alike, rank 0 alone evaluates, writes checkpoints and calls on_epoch (distributed.py).
    stop_requested(wait), single process only: a caller that answers on_epoch later (on_epoch returns
    False at once, training goes on) says here whether it has asked to stop; fit asks it with
    wait=False before each micro-batch, and with wait=True (its answer to the epoch last sent) before
    an epoch's checkpoints are written and after the last epoch. A "stop" abandons the epoch in progress.
    The model is trained in place and left on the training device, in eval mode.
    """
    note = log if log is not None else (lambda message: None)
    task = task if task is not None else Classification()
    _check_arguments(cfg, data, metric, direction, resume_from, task)  # all checked before any work
    if ranks is not None and stop_requested is not None:
        raise ValueError("stop_requested is for a single process: with ranks, on_epoch answers at once on rank 0")
    device = resolve_device(cfg.device)
    amp = resolve_amp(cfg.amp, device)
    seed_everything(seed, deterministic=cfg.deterministic)
    run = _set_up(cfg, model, data, seed=seed, direction=direction, device=device, amp=amp, note=note, task=task, ranks=ranks)

    # ---- restore
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    state, best_path = _resume(cfg, run, resume_from, ckpt_dir, metric=metric, direction=direction, note=note,
                               loaded=resume_checkpoint)
    stop_reason, first_epoch = _first_epoch(cfg, state)
    watch = LossWatch(device, amp, cfg.inject_nan_at_step)

    # ---- per epoch: train, evaluate, checkpoint, the caller
    stop_reason, best_path, last_path = _epochs(cfg, run, watch, state, first_epoch, stop_reason, best_path, data=data, device=device, amp=amp,
                                                metric=metric, direction=direction, seed=seed, ranks=ranks, ckpt_dir=ckpt_dir,
                                                on_epoch=on_epoch, stop_requested=stop_requested, note=note)
    return _fit_result(state, stop_reason, best_path, last_path, resume_from, amp=amp, device=device)
