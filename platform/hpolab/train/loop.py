"""fit(): the shared training routine. Reads top to bottom: check arguments, set up, (resume), epochs.

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

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

from .checkpoint import (
    CHECKPOINT_FORMAT,
    atomic_write_bytes,
    load_checkpoint,
    load_model_state,
    serialize_checkpoint,
    unwrap_model,
)
from .config import TrainConfig
from .data import DataSplits, is_in_memory, labels_of
from .device import autocast, make_grad_scaler, resolve_amp, resolve_device, synchronize
from .losses import criterion_from_config
from .optim import LRSchedule, check_optimizer_covers, check_trainable_parameters, optimizer_from_config
from .seeding import capture_rng_state, make_generator, restore_rng_state, seed_everything, seed_worker

BASE_METRICS = (
    "train_loss",  # mean training criterion over the epoch's samples (incl. smoothing/weights/focal)
    "val_loss",  # plain cross-entropy on the val split (comparable across trials whatever the criterion)
    "val_acc",
    "lr",  # LR of the first param group at the end of the epoch
    "grad_norm",  # mean global L2 norm of the gradients over the epoch's optimizer steps, before clipping
    "grad_norm_max",
    "epoch_seconds",  # wall seconds, train + validation
    "samples_per_second",  # training samples per second of training time
    "data_wait_fraction",  # share of training time spent waiting for a batch / moving it to the device
)
STOP_REASONS = ("max_epochs", "early_stopping", "stopped_by_caller")

# On CUDA, checking the loss for NaN/inf after every micro-step would force a host-device sync each
# step. The losses are queued and checked together every this many micro-steps (and at epoch end);
# the error still names the first bad step. On the CPU there is no sync to avoid: every step, and
# before the backward pass.
CUDA_NONFINITE_CHECK_EVERY = 16


class NonFiniteLossError(RuntimeError):
    """The loss became NaN/inf; the trial cannot continue. `epoch`, `step` (micro-step), `value`."""

    def __init__(self, message: str, *, epoch: int, step: int, value: float):
        super().__init__(message)
        self.epoch = epoch
        self.step = step
        self.value = value


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


def epoch_metric_names(cfg: TrainConfig, num_classes: int) -> list[str]:
    """The keys of each epoch's metrics dict for this config (what `metric` may name)."""
    names = list(BASE_METRICS)
    if imbalance_handling_on(cfg):
        names += ["val_macro_f1"] + [f"val_recall_{c}" for c in range(num_classes)]
    return names


# ---------------------------------------------------------------- batches


class TensorBatches:
    """Batches of an in-memory split, by indexing its tensors directly (no DataLoader, no collate).

    The tensors should already be on the training device. Train order comes from `generator`
    (a fresh permutation, or weighted sampling with replacement, per epoch); without either the
    order is the stored one. drop_last drops a final partial batch, but only when there is more
    than one batch (a split smaller than batch_size still yields one batch).
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
        sample_weights: torch.Tensor | None = None,
        drop_last: bool = False,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.x, self.y = x, y
        self.n = len(x)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.generator = generator
        self.sample_weights = sample_weights
        self.drop_last = drop_last
        self.transform = transform

    def __len__(self) -> int:
        if self.drop_last and self.n > self.batch_size:
            return self.n // self.batch_size
        return math.ceil(self.n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = None
        if self.sample_weights is not None:
            order = torch.multinomial(self.sample_weights, self.n, replacement=True, generator=self.generator)
        elif self.shuffle:
            order = torch.randperm(self.n, generator=self.generator)
        if order is not None:
            order = order.to(self.x.device)
        for b in range(len(self)):
            lo, hi = b * self.batch_size, min((b + 1) * self.batch_size, self.n)
            if order is None:
                x, y = self.x[lo:hi], self.y[lo:hi]
            else:
                idx = order[lo:hi]
                x, y = self.x[idx], self.y[idx]  # advanced indexing copies: transforms may work in place
            if self.transform is not None:
                x = self.transform(x)
            yield x, y


def _inverse_frequency_sample_weights(labels: torch.Tensor) -> torch.Tensor:
    # Each sample weighs 1/count(its class): every class is drawn equally often in expectation.
    counts = torch.bincount(labels)
    return (1.0 / counts.double())[labels]


def _train_batches(cfg: TrainConfig, data: DataSplits, device: torch.device, generator: torch.Generator, note):
    sample_weights = _inverse_frequency_sample_weights(labels_of(data.train)) if cfg.balanced_sampler else None
    if is_in_memory(data.train):
        x, y = data.train.tensors
        # Moved to the device once; every batch is then a gather on the device.
        return TensorBatches(
            x.to(device),
            y.to(device).long(),
            cfg.batch_size,
            shuffle=True,
            generator=generator,
            sample_weights=sample_weights,
            drop_last=True,
            transform=data.train_transform,
        )
    if data.train_transform is not None:
        note("data.train_transform ignored: it applies to in-memory (TensorDataset) data; give the Dataset its transforms")
    sampler = None
    if sample_weights is not None:
        sampler = WeightedRandomSampler(sample_weights, num_samples=len(data.train), replacement=True, generator=generator)
    return DataLoader(
        data.train,
        batch_size=cfg.batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        drop_last=len(data.train) > cfg.batch_size,  # avoid a 1-sample BatchNorm batch, keep >= 1 batch
        num_workers=cfg.num_workers,
        pin_memory=device.type == "cuda",  # page-locked host memory: async (non_blocking) copies
        persistent_workers=cfg.num_workers > 0,  # no worker start-up cost every epoch
        worker_init_fn=seed_worker,
        generator=generator,  # shuffle order and worker base seeds
    )


def _eval_batches(dataset: Dataset, batch_size: int, device: torch.device, num_workers: int = 0, seed: int = 0):
    if is_in_memory(dataset):
        x, y = dataset.tensors
        return TensorBatches(x.to(device), y.to(device).long(), batch_size)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        drop_last=False,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        persistent_workers=num_workers > 0,
        worker_init_fn=seed_worker,
        # Its own generator: validation must not advance the train split's shuffle stream.
        generator=make_generator(seed + 1),
    )


def _to_device(x: torch.Tensor, y: torch.Tensor, device: torch.device, channels_last: bool):
    # non_blocking: with pinned host memory the copy overlaps compute; a no-op for on-device tensors.
    x = x.to(device, non_blocking=True)
    y = y.to(device, non_blocking=True).long()
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y


# ---------------------------------------------------------------- evaluation


def _classification_stats(labels: torch.Tensor, preds: torch.Tensor, num_classes: int) -> dict[str, Any]:
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must be in 0..{num_classes - 1}, got {int(labels.min())}..{int(labels.max())}")
    # Confusion matrix on the CPU: bincount on CUDA is not allowed under deterministic algorithms.
    conf = torch.bincount(labels * num_classes + preds, minlength=num_classes * num_classes).reshape(num_classes, num_classes)
    conf = conf.double()
    tp, support, predicted = conf.diag(), conf.sum(1), conf.sum(0)
    recall = [float(tp[c] / support[c]) if support[c] > 0 else math.nan for c in range(num_classes)]
    # Macro F1 over the classes that occur in the labels or the predictions (as scikit-learn does).
    seen = (support + predicted) > 0
    f1 = 2 * tp[seen] / (support[seen] + predicted[seen])
    return {
        "acc": float(tp.sum() / max(labels.numel(), 1)),
        "macro_f1": float(f1.mean()) if seen.any() else math.nan,
        "recall": recall,
    }


def _evaluate_batches(model: nn.Module, batches, *, num_classes: int, device: torch.device, amp: str, channels_last: bool = False):
    """Loss (plain cross-entropy), accuracy, macro-F1, per-class recall. eval mode + inference_mode."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    all_preds, all_labels = [], []
    try:
        with torch.inference_mode(), autocast(device, amp):
            for x, y in batches:
                x, y = _to_device(x, y, device, channels_last)
                logits = model(x).float()
                loss_sum += F.cross_entropy(logits, y, reduction="sum")
                all_preds.append(logits.argmax(dim=1))
                all_labels.append(y)
    finally:
        model.train(was_training)  # restore, so evaluation can be called from anywhere
    if not all_labels:
        raise ValueError("cannot evaluate an empty split")
    labels = torch.cat(all_labels).cpu()  # one device sync per evaluation
    preds = torch.cat(all_preds).cpu()
    stats = _classification_stats(labels, preds, num_classes)
    stats["loss"] = float(loss_sum) / labels.numel()
    stats["n"] = int(labels.numel())
    return stats


def evaluate(
    model: nn.Module,
    dataset: Dataset,
    *,
    num_classes: int,
    device: str | torch.device = "cpu",
    batch_size: int = 512,
    amp: str = "off",
) -> dict[str, Any]:
    """Evaluate a classifier on a split (e.g. the held-out test split).

    Returns {"loss": mean cross-entropy, "acc", "macro_f1", "recall": per-class list (nan for a
    class absent from the split), "n": samples}. The model is moved to `device` ("auto", "cpu",
    "cuda", "cuda:1", ...); its train/eval mode is restored afterwards.
    """
    if isinstance(device, str) and device in ("auto", "cpu", "cuda"):
        dev = resolve_device(device)
    else:
        dev = torch.device(device)
    resolved_amp = resolve_amp(amp, dev)
    model.to(dev)
    batches = _eval_batches(dataset, batch_size, dev)
    return _evaluate_batches(model, batches, num_classes=num_classes, device=dev, amp=resolved_amp)


# ---------------------------------------------------------------- NaN/inf watch


class _LossWatch:
    """Raises NonFiniteLossError for the first NaN/inf training loss (see CUDA_NONFINITE_CHECK_EVERY)."""

    def __init__(self, device: torch.device, amp: str, inject_nan_at_step: int | None):
        self.every = 1 if device.type == "cpu" else CUDA_NONFINITE_CHECK_EVERY
        self.amp = amp
        self.inject_nan_at_step = inject_nan_at_step
        self.pending: list[tuple[int, int, int, torch.Tensor]] = []

    def add(self, epoch: int, micro_step: int, global_step: int, loss: torch.Tensor) -> None:
        self.pending.append((epoch, micro_step, global_step, loss.detach()))
        if len(self.pending) >= self.every:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        finite = torch.isfinite(torch.stack([loss.float() for *_, loss in self.pending]))
        if not bool(finite.all()):  # the only host-device sync here
            epoch, step, opt_step, loss = self.pending[int((~finite).nonzero()[0])]
            value = float(loss)
            msg = (
                f"training loss is {value} at epoch {epoch}, micro-step {step} "
                f"(0-based, counted from the start of training; optimizer step {opt_step})."
            )
            if step == self.inject_nan_at_step:
                msg += " It was injected (inject_nan_at_step)."
            if self.amp == "fp16":
                msg += " Under fp16 autocast values overflow easily: try amp=bf16 or amp=off."
            msg += " Lower the lr, set grad_clip_norm, or check the inputs for NaN/inf."
            self.pending.clear()
            raise NonFiniteLossError(msg, epoch=epoch, step=step, value=value)
        self.pending.clear()


# ---------------------------------------------------------------- fit


def _better(value: float, reference: float, direction: str, min_delta: float = 0.0) -> bool:
    """Whether `value` improves on `reference` by more than min_delta (a nan reference: anything finite does)."""
    if not math.isfinite(value):
        return False
    if math.isnan(reference):
        return True
    if direction == "maximize":
        return value > reference + min_delta
    return value < reference - min_delta


def _config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    def norm(v):
        return list(v) if isinstance(v, tuple) else v

    keys = sorted(set(saved) | set(current))
    return [f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in keys if norm(saved.get(k)) != norm(current.get(k))]


def fit(
    cfg: TrainConfig,
    model: nn.Module,
    data: DataSplits,
    *,
    metric: str = "val_acc",
    direction: str = "maximize",
    seed: int = 0,
    on_epoch: Callable[[int, dict[str, float]], bool] | None = None,
    checkpoint_dir: str | Path | None = None,
    resume_from: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> FitResult:
    """Train `model` on `data` as `cfg` says; select the best epoch by `metric` (`direction`).

    on_epoch(epoch, metrics) is called after each epoch, once that epoch's checkpoints are written;
    returning True stops training ("stopped_by_caller", e.g. a pruned trial). checkpoint_dir gets
    last.pt every epoch and best.pt when the metric improves. resume_from: a last.pt to continue
    from at its next epoch, bit-for-bit as if never interrupted (same device, same seed, same
    config; with persistent DataLoader workers the workers' own RNG restarts). log receives
    human-readable notes. Raises NonFiniteLossError on a NaN/inf loss, torch.cuda.OutOfMemoryError
    as torch does (the caller decides whether to retry with a smaller micro-batch).

    "Best" (best_value, best.pt) is any strict improvement of the metric; early stopping counts
    epochs without an improvement larger than cfg.early_stopping_min_delta.
    The model is trained in place and left on the training device, in eval mode.
    """
    note = log if log is not None else (lambda message: None)

    # ---- arguments, all checked before any work
    available = epoch_metric_names(cfg, data.num_classes)
    if metric not in available:
        hint = ""
        if metric == "val_macro_f1" or metric.startswith("val_recall_"):
            hint = " (val_macro_f1 and val_recall_<class> exist when an imbalance option is on: class_weighting, balanced_sampler or focal_gamma)"
        raise ValueError(f"metric {metric!r} is not an epoch metric of this run; available: {', '.join(available)}{hint}")
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"direction must be 'maximize' or 'minimize', got {direction!r}")
    if len(data.train) == 0 or len(data.val) == 0:
        raise ValueError(f"the train and val splits must not be empty (train={len(data.train)}, val={len(data.val)})")
    if resume_from is not None and not Path(resume_from).is_file():
        raise FileNotFoundError(f"resume_from: no checkpoint at {resume_from}")
    device = resolve_device(cfg.device)
    amp = resolve_amp(cfg.amp, device)

    # ---- environment
    seed_everything(seed, deterministic=cfg.deterministic)

    # ---- model
    raw_model = unwrap_model(model)  # parameters, state_dicts and checkpoints use the plain module
    check_trainable_parameters(raw_model)
    raw_model.to(device)
    channels_last = cfg.channels_last and len(data.input_shape) == 3
    if cfg.channels_last and not channels_last:
        note(f"channels_last ignored: it applies to image inputs (C, H, W), these are {tuple(data.input_shape)}")
    if channels_last:
        raw_model.to(memory_format=torch.channels_last)
    net = model
    if cfg.compile and net is raw_model:
        net = torch.compile(raw_model)

    # ---- data
    generator = make_generator(seed)
    train_batches = _train_batches(cfg, data, device, generator, note)
    val_batches = _eval_batches(data.val, cfg.eval_batch_size, device, cfg.num_workers, seed)
    micro_per_epoch = len(train_batches)
    accum = cfg.grad_accum_steps
    steps_per_epoch = math.ceil(micro_per_epoch / accum)  # optimizer steps

    # ---- loss, optimizer, schedule, scaler
    criterion = criterion_from_config(cfg, data, device)
    optimizer = optimizer_from_config(cfg, raw_model, lr=cfg.lr)
    check_optimizer_covers(raw_model, optimizer)
    if cfg.scheduler == "onecycle" and cfg.warmup_epochs > 0:
        note("warmup_epochs ignored with scheduler=onecycle (OneCycle has its own warm-up)")
    schedule = LRSchedule(
        cfg.scheduler,
        optimizer,
        lr=cfg.lr,
        steps_per_epoch=steps_per_epoch,
        max_epochs=cfg.max_epochs,
        warmup_epochs=cfg.warmup_epochs,
        min_lr=cfg.min_lr,
        step_size=cfg.step_size,
        gamma=cfg.gamma,
        plateau_patience=cfg.plateau_patience,
        direction=direction,
    )
    scaler = make_grad_scaler(amp)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    max_norm = cfg.grad_clip_norm if cfg.grad_clip_norm is not None else math.inf  # inf: measure, never clip
    imbalance = imbalance_handling_on(cfg)

    note(
        f"device={device} amp={amp} compile={cfg.compile} channels_last={channels_last} "
        f"data={'in-memory' if isinstance(train_batches, TensorBatches) else f'DataLoader(num_workers={cfg.num_workers})'} "
        f"micro_batches/epoch={micro_per_epoch} optimizer_steps/epoch={steps_per_epoch} "
        f"effective_batch={cfg.batch_size * accum} deterministic={cfg.deterministic}"
    )

    # ---- training state (restored on resume)
    history: list[dict[str, float]] = []
    best_value, best_epoch = math.nan, 0
    es_reference, bad_epochs = math.nan, 0  # early stopping: value to beat by min_delta, epochs without
    global_step = micro_step = 0
    start_epoch = 1
    best_path: Path | None = None
    last_path: Path | None = None
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None

    if resume_from is not None:
        ckpt = load_checkpoint(resume_from, map_location="cpu")
        if ckpt.get("format_version") != CHECKPOINT_FORMAT:
            raise ValueError(f"{resume_from}: checkpoint format {ckpt.get('format_version')!r}, expected {CHECKPOINT_FORMAT}")
        if ckpt["metric"] != metric or ckpt["direction"] != direction:
            raise ValueError(
                f"{resume_from} tracked {ckpt['metric']} ({ckpt['direction']}); resume with the same metric and "
                f"direction, not {metric} ({direction})"
            )
        load_model_state(raw_model, ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        schedule.load_state_dict(ckpt["scheduler"])
        if scaler.is_enabled() and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        history = [dict(h) for h in ckpt["history"]]
        best_value, best_epoch = float(ckpt["best_value"]), int(ckpt["best_epoch"])
        es_reference = float(ckpt["early_stopping"]["best"])
        bad_epochs = int(ckpt["early_stopping"]["bad_epochs"])
        global_step, micro_step = int(ckpt["global_step"]), int(ckpt["micro_step"])
        start_epoch = int(ckpt["epoch"]) + 1
        diffs = _config_differences(ckpt["config"], dataclasses.asdict(cfg))
        if diffs:
            note("config differs from the checkpoint's (resume is exact only with the same config): " + "; ".join(diffs))
        for candidate in ([ckpt_dir / "best.pt"] if ckpt_dir else []) + [Path(resume_from).parent / "best.pt"]:
            if best_epoch and candidate.is_file():
                best_path = candidate
                break
        restore_rng_state(ckpt["rng"], generator)  # last: nothing after this may draw random numbers
        del ckpt
        note(f"resumed at epoch {start_epoch} of {cfg.max_epochs} from {resume_from}")

    patience = cfg.early_stopping_patience
    stop_reason = "max_epochs"
    if patience is not None and bad_epochs >= patience:
        stop_reason = "early_stopping"  # the checkpoint was written by an early-stopped run
        start_epoch = cfg.max_epochs + 1
    watch = _LossWatch(device, amp, cfg.inject_nan_at_step)

    try:
        for epoch in range(start_epoch, cfg.max_epochs + 1):
            # ---- train one epoch
            net.train()
            t_epoch = time.perf_counter()
            data_wait = 0.0  # seconds
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            samples = 0
            norm_sum = torch.zeros((), device=device)
            norm_max = torch.zeros((), device=device)
            norm_count = torch.zeros((), device=device)

            t_wait = time.perf_counter()
            for i, (x, y) in enumerate(train_batches):
                x, y = _to_device(x, y, device, channels_last)
                data_wait += time.perf_counter() - t_wait

                group_start = i - i % accum
                group_size = min(accum, micro_per_epoch - group_start)  # the last group may be partial
                if i == group_start:
                    optimizer.zero_grad(set_to_none=True)

                if cfg.inject_oom_at_step is not None and micro_step == cfg.inject_oom_at_step:
                    raise torch.cuda.OutOfMemoryError(
                        f"injected CUDA out of memory at micro-step {micro_step} (inject_oom_at_step)"
                    )
                with autocast(device, amp):
                    logits = net(x)
                    loss = criterion(logits, y)
                if cfg.inject_nan_at_step is not None and micro_step == cfg.inject_nan_at_step:
                    loss = loss * float("nan")
                watch.add(epoch, micro_step, global_step, loss)

                # Mean over the group's samples: each micro-batch loss is a mean over its batch, and
                # the group has `group_size` equal-sized micro-batches.
                scaler.scale(loss / group_size).backward()
                loss_sum += loss.detach().double() * len(y)
                samples += len(y)

                if i - group_start + 1 == group_size:
                    scaler.unscale_(optimizer)  # clip and measure true gradients under fp16
                    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
                    finite = torch.isfinite(norm)  # fp16 overflow steps (skipped by the scaler) are left out
                    norm = torch.where(finite, norm, torch.zeros_like(norm))
                    norm_sum += norm
                    norm_max = torch.maximum(norm_max, norm)
                    norm_count += finite
                    scaler.step(optimizer)
                    scaler.update()
                    schedule.after_optimizer_step()
                    global_step += 1
                micro_step += 1
                t_wait = time.perf_counter()
            watch.flush()
            synchronize(device)
            train_seconds = time.perf_counter() - t_epoch

            # ---- validate
            val = _evaluate_batches(
                net, val_batches, num_classes=data.num_classes, device=device, amp=amp, channels_last=channels_last
            )
            if not math.isfinite(val["loss"]):
                raise NonFiniteLossError(
                    f"validation loss is {val['loss']} after epoch {epoch}: the weights have diverged "
                    "(lower the lr or set grad_clip_norm" + ("; or try amp=bf16/off" if amp == "fp16" else "") + ")",
                    epoch=epoch,
                    step=micro_step,
                    value=val["loss"],
                )
            n_norms = float(norm_count)
            metrics: dict[str, float] = {
                "train_loss": float(loss_sum) / samples,
                "val_loss": val["loss"],
                "val_acc": val["acc"],
                "lr": math.nan,  # set below, around the epoch-end scheduler step
                "grad_norm": float(norm_sum) / n_norms if n_norms else math.nan,
                "grad_norm_max": float(norm_max) if n_norms else math.nan,
                "epoch_seconds": math.nan,
                "samples_per_second": samples / train_seconds,
                "data_wait_fraction": data_wait / train_seconds,
            }
            if imbalance:
                metrics["val_macro_f1"] = val["macro_f1"]
                for c, r in enumerate(val["recall"]):
                    metrics[f"val_recall_{c}"] = r

            metrics["lr"] = float(optimizer.param_groups[0]["lr"])
            schedule.after_epoch(metrics[metric])  # ReduceLROnPlateau acts here
            metrics["lr"] = float(optimizer.param_groups[0]["lr"])  # the LR the next epoch starts with
            metrics["epoch_seconds"] = time.perf_counter() - t_epoch
            value = metrics[metric]

            # ---- best and early stopping
            improved = _better(value, best_value, direction)
            if improved:
                best_value, best_epoch = value, epoch
            if _better(value, es_reference, direction, cfg.early_stopping_min_delta):
                es_reference, bad_epochs = value, 0
            else:
                bad_epochs += 1
            history.append({"epoch": epoch, **metrics})

            # ---- checkpoints, then the caller
            if ckpt_dir is not None:
                blob = serialize_checkpoint(
                    {
                        "format_version": CHECKPOINT_FORMAT,
                        "epoch": epoch,
                        "global_step": global_step,
                        "micro_step": micro_step,
                        "model": raw_model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": schedule.state_dict(),
                        "scaler": scaler.state_dict() if scaler.is_enabled() else None,
                        "metric": metric,
                        "direction": direction,
                        "best_value": best_value,
                        "best_epoch": best_epoch,
                        "early_stopping": {"best": es_reference, "bad_epochs": bad_epochs},
                        "rng": capture_rng_state(generator),
                        "config": dataclasses.asdict(cfg),
                        "history": history,
                        "amp": amp,
                        "device": str(device),
                        "torch_version": str(torch.__version__),  # TorchVersion is not weights_only-loadable
                    }
                )
                last_path = atomic_write_bytes(blob, ckpt_dir / "last.pt")
                if improved:
                    best_path = atomic_write_bytes(blob, ckpt_dir / "best.pt")
                del blob

            if on_epoch is not None and on_epoch(epoch, dict(metrics)):
                stop_reason = "stopped_by_caller"
                note(f"stopped by the caller after epoch {epoch}")
                break
            if patience is not None and bad_epochs >= patience:
                stop_reason = "early_stopping"
                note(
                    f"early stopping after epoch {epoch}: {metric} has not improved by more than "
                    f"{cfg.early_stopping_min_delta} for {bad_epochs} epochs (best {best_value:.6g} at epoch {best_epoch})"
                )
                break
    except RuntimeError as e:
        if cfg.deterministic and "deterministic implementation" in str(e):
            raise RuntimeError(
                f"deterministic=true, but an operation of this model has no deterministic implementation on "
                f"{device.type}. Set deterministic=false, or replace the operation. torch: {e}"
            ) from e
        raise

    last_metrics = {k: v for k, v in history[-1].items() if k != "epoch"} if history else {}
    return FitResult(
        best_value=best_value,
        best_epoch=best_epoch,
        epochs_run=len(history),
        stop_reason=stop_reason,
        history=history,
        last_metrics=last_metrics,
        best_checkpoint=best_path,
        # Written by this call; when none was (no checkpoint_dir, or nothing left to train), the resumed one.
        last_checkpoint=last_path if last_path is not None or resume_from is None else Path(resume_from),
        amp=amp,
        device=str(device),
    )
