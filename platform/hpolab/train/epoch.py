"""One training epoch: micro-batches grouped into optimizer steps, and the epoch's training statistics.

With grad_accum_steps=k an epoch of m micro-batches takes ceil(m / k) optimizer steps; the last
group may be partial, and its loss is then divided by its own size. `micro_step` and
`global_step` count from the start of training (across epochs and resumes); fault injection
(`cfg.inject_oom_at_step`, `cfg.inject_nan_at_step`) refers to `micro_step`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .batches import Batches, to_device
from .config import TrainConfig
from .device import synchronize
from .nonfinite import LossWatch
from .optim import LRSchedule
from .step import TrainStep


@dataclass
class GradNorms:
    """The global gradient norm (before clipping) of an epoch's optimizer steps, summed on the device
    (no host sync per step). Overflowed fp16 steps (skipped by the scaler) are left out."""

    total: torch.Tensor
    max: torch.Tensor
    count: torch.Tensor

    @classmethod
    def zeros(cls, device: torch.device) -> "GradNorms":
        return cls(torch.zeros((), device=device), torch.zeros((), device=device), torch.zeros((), device=device))

    def add(self, norm: torch.Tensor) -> None:
        finite = torch.isfinite(norm)
        norm = torch.where(finite, norm, torch.zeros_like(norm))
        self.total += norm
        self.max = torch.maximum(self.max, norm)
        self.count += finite


@dataclass
class EpochTraining:
    started: float  # time.perf_counter() at the start of the epoch
    seconds: float  # wall seconds of training, device work included
    data_wait: float  # seconds spent waiting for a batch and moving it to the device
    loss_sum: torch.Tensor  # float64 sum over samples of the training criterion
    samples: int
    norms: GradNorms
    micro_step: int  # counters after the epoch
    global_step: int


def _accumulating(net: torch.nn.Module, ends_group: bool) -> contextlib.AbstractContextManager:
    """Multi-device (DDP): no gradient all-reduce on the micro-steps before the last of an accumulation
    group (`no_sync()`, around forward and backward); a no-op for a plain module."""
    no_sync = getattr(net, "no_sync", None)
    return no_sync() if no_sync is not None and not ends_group else contextlib.nullcontext()


def train_epoch(
    cfg: TrainConfig,
    step: TrainStep,
    batches: Batches,
    schedule: LRSchedule,
    watch: LossWatch,
    *,
    epoch: int,
    micro_step: int,
    global_step: int,
    channels_last: bool,
    interrupted: Callable[[], bool] | None = None,
) -> EpochTraining | None:
    """Train `step.net` on one pass over `batches`; the per-step schedule advances after each optimizer step.

    interrupted(), when given, is asked before each micro-batch; True abandons the epoch (None is
    returned: the caller stops training, and what this epoch changed is never recorded)."""
    step.net.train()
    t_epoch = time.perf_counter()
    data_wait = 0.0  # seconds
    loss_sum = torch.zeros((), dtype=torch.float64, device=step.device)
    samples = 0
    norms = GradNorms.zeros(step.device)
    micro_per_epoch, accum = len(batches), cfg.grad_accum_steps

    t_wait = time.perf_counter()
    for i, (x, y) in enumerate(batches):
        if interrupted is not None and interrupted():
            return None
        x, y = to_device(x, y, step.device, channels_last, step.target_dtype)
        data_wait += time.perf_counter() - t_wait

        group_start = i - i % accum
        group_size = min(accum, micro_per_epoch - group_start)  # the last group may be partial
        if i == group_start:
            step.zero_grad()

        if cfg.inject_oom_at_step is not None and micro_step == cfg.inject_oom_at_step:
            raise torch.cuda.OutOfMemoryError(f"injected CUDA out of memory at micro-step {micro_step} (inject_oom_at_step)")
        ends_group = i - group_start + 1 == group_size
        with _accumulating(step.net, ends_group):
            loss = step.loss(x, y)
            if cfg.inject_nan_at_step is not None and micro_step == cfg.inject_nan_at_step:
                loss = loss * float("nan")
            watch.add(epoch, micro_step, global_step, loss)
            step.backward(loss, group_size)  # mean over the group's samples
        loss_sum += loss.detach().double() * len(y)
        samples += len(y)

        if ends_group:
            norms.add(step.step())
            schedule.after_optimizer_step()
            global_step += 1
        micro_step += 1
        t_wait = time.perf_counter()
    watch.flush()
    synchronize(step.device)
    seconds = time.perf_counter() - t_epoch
    return EpochTraining(t_epoch, seconds, data_wait, loss_sum, samples, norms, micro_step, global_step)
