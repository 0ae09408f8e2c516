"""One training step, shared by fit() and the LR sweep.

A step is: zero the gradients; for each of its micro-batches, forward under autocast and a
scaled backward of the loss divided by the number of micro-batches in the step; then unscale
(true gradients under fp16), clip by global norm, optimizer step, GradScaler update. The caller
owns the order around it (which micro-batch starts a step, NaN checks, schedules, timing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from .config import TrainConfig
from .data import DataSplits
from .device import autocast, make_grad_scaler
from .optim import check_optimizer_covers, optimizer_from_config


@dataclass
class TrainStep:
    net: nn.Module  # what runs forward (a torch.compile'd wrapper, or the plain module)
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # the task's training loss (a mean over the batch)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler  # pass-through unless amp=fp16
    params: list[nn.Parameter]  # every parameter the optimizer updates: clipped as one vector
    max_norm: float  # clipping threshold for the global L2 norm; inf: measure, never clip
    device: torch.device
    amp: str  # resolved: off | bf16 | fp16
    target_dtype: torch.dtype | None = torch.long  # the task's: batches convert targets to it

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)  # once per optimizer step

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The criterion of one micro-batch (a mean over its samples), computed under autocast."""
        with autocast(self.device, self.amp):
            return self.criterion(self.net(x), y)

    def backward(self, loss: torch.Tensor, micro_batches: int) -> None:
        # Each micro-batch loss is a mean over its batch; dividing by the number of equal-sized
        # micro-batches in the step makes the accumulated gradient that of the step's mean loss.
        self.scaler.scale(loss / micro_batches).backward()

    def step(self) -> torch.Tensor:
        """Unscale, clip, step, update. Returns the global gradient norm before clipping (a tensor;
        inf/nan when an fp16 step overflowed, which the scaler then skips)."""
        self.scaler.unscale_(self.optimizer)  # clip and measure true gradients under fp16
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return norm


def make_train_step(
    cfg: TrainConfig,
    data: DataSplits,
    model: nn.Module,
    *,
    device: torch.device,
    amp: str,
    lr: float,
    net: nn.Module | None = None,
    bound: Any = None,
) -> TrainStep:
    """The task's training criterion, the optimizer (over `model`, the plain module, at `lr`) and GradScaler.

    `net` is what runs forward when it is not `model` itself (e.g. torch.compile(model)). `bound`: the
    task bound to `data` (train/tasks/); classification with the trainer's options when None.
    """
    if bound is None:
        from .tasks import Classification

        bound = Classification().bind(cfg, data, device)
    criterion = bound.criterion
    optimizer = optimizer_from_config(cfg, model, lr=lr)
    check_optimizer_covers(model, optimizer)
    return TrainStep(
        net=model if net is None else net,
        criterion=criterion,
        optimizer=optimizer,
        scaler=make_grad_scaler(amp),
        params=[p for group in optimizer.param_groups for p in group["params"]],
        max_norm=cfg.grad_clip_norm if cfg.grad_clip_norm is not None else math.inf,
        device=device,
        amp=amp,
        target_dtype=bound.task.target_dtype,
    )
