"""LR range test (Leslie Smith, "Cyclical Learning Rates", 2017; the fastai `lr_find`).

Train a *copy* of the model for `num_steps` optimizer steps while the LR grows from `min_lr` to
`max_lr` (geometrically by default), record the training loss of every step, smooth it, and stop
once it has clearly diverged. The curve says which LRs learn fast and where training breaks.

How it trains -- the trainer's own settings, through the train/ helpers, so the curve describes the
runs it is meant to configure: optimizer and its parameter groups (weight decay excluded from
biases/norms), AMP mode and GradScaler, gradient accumulation (each sweep step is ONE optimizer
step of `grad_accum_steps` micro-batches, the LR being per optimizer step at the effective batch),
micro-batch size, gradient clipping, label smoothing / class weights / focal loss, balanced
sampler, channels_last. No LR scheduler (the sweep *is* the schedule), no validation, and no
torch.compile (compiling would cost more than a 100-step sweep). The caller's model is never
touched: the sweep trains a deep copy, so its parameters, buffers (BatchNorm statistics) and
requires_grad flags are bit-identical afterwards.

The sweep and its stop test are lr_sweep.py, the suggestion rules and the search-space bounds
lr_suggest.py (their docstrings describe the curve and the rules); this module runs the test.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from .batches import forever, train_batches
from .checkpoint import unwrap_model
from .config import TrainConfig
from .data import DataSplits
from .device import resolve_amp, resolve_device
from .lr_suggest import (  # noqa: F401 -- the names below were all defined here before the split
    FLAT_MIN_NOISE_MULTIPLE,
    FLAT_MIN_RELATIVE_DROP,
    MIN_POINTS,
    NOISY_NOISE_MULTIPLE,
    SKIP_END_FRACTION,
    SKIP_START_FRACTION,
    SUGGESTION_RULE,
    LRRangeResult,
    bounds_from_lr_range_test,
    rule_suggestions,
    suggest,
    valley_index,
    zero_lag_smooth,
)
from .lr_sweep import (  # noqa: F401
    DIVERGE_RUN,
    LOSS_FLOOR,
    START_FLOOR_FRACTION,
    DivergenceWatch,
    check_sweep_args,
    find_divergence,
    lr_schedule,
    sweep,
)
from .optim import check_trainable_parameters
from .seeding import make_generator, seed_everything
from .step import make_train_step


def _private_copy(cfg: TrainConfig, model: nn.Module, data: DataSplits, device: torch.device) -> tuple[nn.Module, bool]:
    """A private copy of the model on `device`, in train mode: the caller's weights, buffers and flags stay as they are."""
    source = unwrap_model(model)
    check_trainable_parameters(source)
    net = copy.deepcopy(source).to(device)
    channels_last = cfg.channels_last and len(data.input_shape) == 3
    if channels_last:
        net.to(memory_format=torch.channels_last)
    net.train()
    return net, channels_last


def _settings(cfg: TrainConfig, *, min_lr: float, max_lr: float, num_steps: int, mode: str, smoothing: float,
              diverge_factor: float, seed: int, amp: Any, device: torch.device) -> dict[str, Any]:
    """The sweep and trainer settings of a result, plain data."""
    return {
        "min_lr": min_lr,
        "max_lr": max_lr,
        "num_steps": num_steps,
        "mode": mode,
        "smoothing": smoothing,
        "diverge_factor": diverge_factor,
        "seed": seed,
        "optimizer": cfg.optimizer,
        "weight_decay": cfg.weight_decay,
        "batch_size": cfg.batch_size,
        "grad_accum_steps": cfg.grad_accum_steps,
        "effective_batch": cfg.batch_size * cfg.grad_accum_steps,
        "grad_clip_norm": cfg.grad_clip_norm,
        "amp": amp,
        "device": str(device),
    }


def lr_range_test(
    cfg: TrainConfig,
    model: nn.Module,
    data: DataSplits,
    *,
    min_lr: float = 1e-7,
    max_lr: float = 10.0,
    num_steps: int = 100,
    mode: str = "exp",
    smoothing: float = 0.05,
    diverge_factor: float = 4.0,
    seed: int = 0,
    task: Any = None,
) -> LRRangeResult:
    """Run the LR range test on a deep copy of `model` with the trainer settings `cfg`.

    Each of the `num_steps` sweep steps is one optimizer step (cfg.grad_accum_steps micro-batches
    of cfg.batch_size). Seeds the global RNGs like fit() does (seed_everything(seed)). Returns the
    curve and the suggestions (see lr_suggest.py for the rules).
    """
    check_sweep_args(min_lr, max_lr, num_steps, mode, smoothing, diverge_factor)
    t0 = time.perf_counter()
    seed_everything(seed, deterministic=cfg.deterministic)
    device = resolve_device(cfg.device)
    amp = resolve_amp(cfg.amp, device)

    net, channels_last = _private_copy(cfg, model, data, device)

    # ---- the trainer's loss, optimizer, scaler and batches (no scheduler: the sweep sets the LR itself)
    lrs_planned = lr_schedule(min_lr, max_lr, num_steps, mode)
    bound = task.bind(cfg, data, device) if task is not None else None  # the task's loss (classification: None)
    step = make_train_step(cfg, data, net, device=device, amp=amp, lr=lrs_planned[0], bound=bound)
    if len(data.train) == 0:
        raise ValueError("the train split is empty")
    # fit()'s training batches (shuffled or balanced, drop_last), reshuffled when the split is exhausted
    batches = forever(train_batches(cfg, data, device, make_generator(seed), target_dtype=step.target_dtype))
    curve = sweep(
        step, batches, lrs_planned, accum=cfg.grad_accum_steps, channels_last=channels_last, smoothing=smoothing, diverge_factor=diverge_factor
    )
    del net, step, batches

    settings = _settings(cfg, min_lr=min_lr, max_lr=max_lr, num_steps=num_steps, mode=mode, smoothing=smoothing,
                         diverge_factor=diverge_factor, seed=seed, amp=amp, device=device)
    return LRRangeResult(
        lrs=curve.lrs,
        losses=curve.losses,
        smoothed=curve.smoothed,
        diverged_at_lr=curve.diverged_at,
        stopped_early=curve.diverged_at is not None,
        reason=curve.reason or f"completed all {num_steps} steps up to max_lr={max_lr:.3g} without diverging",
        settings=settings,
        seconds=time.perf_counter() - t0,
        **suggest(curve.lrs, curve.losses, curve.smoothed, diverged=curve.diverged_at is not None),
    )
