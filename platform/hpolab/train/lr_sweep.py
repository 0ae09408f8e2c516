"""The LR range test's sweep: one optimizer step per planned LR, the loss of each step smoothed, and
the stop test that ends the sweep once the loss has diverged (`DivergenceWatch`).

Curve:
- lrs[i] is the LR of sweep step i; losses[i] the mean training loss of that step's micro-batches,
  measured *before* the step's update (the loss the step starts from, as fastai records it).
- smoothed: exponential moving average with weight `smoothing` on the newest loss, bias-corrected
  (avg_i / (1 - (1 - smoothing)^(i+1))), so the first points are not dragged towards 0.
- Stop early when the loss has diverged (`DivergenceWatch`): the raw loss above `diverge_factor` x
  its best for DIVERGE_RUN steps in a row (the first of them is the divergence point), or the
  smoothed loss above `diverge_factor` x its best (that point is the divergence point), or a loss
  that is NaN/inf (that step is not recorded, its LR is the divergence point). The raw test is
  needed because the EMA lags: on the digits CNN the raw loss went 0.24 -> 7.7 while the smoothed
  loss never reached 4 x its (lagged) best. The data cycles (reshuffled) when the split is exhausted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from .batches import to_device
from .step import TrainStep

LOSS_FLOOR = 1e-6  # best losses below this count as this in the divergence test (avoid 4 x 0)
DIVERGE_RUN = 3  # raw-loss divergence: this many steps in a row above diverge_factor x best
START_FLOOR_FRACTION = 0.1  # divergence test: best loss counts as >= this x the first losses (median of DIVERGE_RUN)


def check_sweep_args(min_lr: float, max_lr: float, num_steps: int, mode: str, smoothing: float, diverge_factor: float) -> None:
    problems = []
    if not (0 < min_lr < max_lr and math.isfinite(max_lr)):
        problems.append(f"need 0 < min_lr < max_lr (finite), got min_lr={min_lr}, max_lr={max_lr}")
    if num_steps < 5:
        problems.append(f"num_steps must be >= 5 (100 is typical), got {num_steps}")
    if mode not in ("exp", "linear"):
        problems.append(f"mode must be 'exp' or 'linear', got {mode!r}")
    if not 0 < smoothing < 1:
        problems.append(f"smoothing is the EMA weight of the newest loss, in (0, 1) (e.g. 0.05), got {smoothing}")
    if not diverge_factor > 1:
        problems.append(f"diverge_factor must be > 1 (e.g. 4), got {diverge_factor}")
    if problems:
        raise ValueError("lr_range_test: " + "; ".join(problems))


def lr_schedule(min_lr: float, max_lr: float, num_steps: int, mode: str = "exp") -> list[float]:
    """The LR of each sweep step: geometric (exp) or arithmetic (linear) from min_lr to max_lr inclusive."""
    t = np.arange(num_steps) / (num_steps - 1)
    if mode == "exp":
        lrs = min_lr * (max_lr / min_lr) ** t
    elif mode == "linear":
        lrs = min_lr + (max_lr - min_lr) * t
    else:
        raise ValueError(f"mode must be 'exp' or 'linear', got {mode!r}")
    lrs[0], lrs[-1] = min_lr, max_lr  # exact end points despite rounding
    return [float(v) for v in lrs]


@dataclass
class _Curve:
    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    diverged_at: float | None  # LR at which the sweep stopped for divergence
    reason: str | None  # why it stopped early; None when it ran every step


def sweep(
    step: TrainStep,
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    lrs_planned: list[float],
    *,
    accum: int,
    channels_last: bool,
    smoothing: float,
    diverge_factor: float,
) -> _Curve:
    """One optimizer step of `accum` micro-batches per planned LR, until the loss diverges."""
    curve = _Curve([], [], [], None, None)
    watch = DivergenceWatch(smoothing, diverge_factor)
    for i, lr in enumerate(lrs_planned):
        for group in step.optimizer.param_groups:
            group["lr"] = lr
        step.zero_grad()
        step_loss = torch.zeros((), dtype=torch.float64, device=step.device)
        for _ in range(accum):
            x, y = to_device(*next(batches), step.device, channels_last, step.target_dtype)
            loss = step.loss(x, y)
            step.backward(loss, accum)  # micro-batches are equal-sized: the step's loss is the mean of theirs
            step_loss += loss.detach().double() / accum
        value = float(step_loss)  # one host sync per step: the stop test needs the value now
        if not math.isfinite(value):
            curve.diverged_at, curve.reason = lr, f"loss became {value} at step {i} (lr={lr:.3g})"
            break
        step.step()

        curve.lrs.append(lr)
        curve.losses.append(value)
        curve.smoothed.append(watch.add(value))
        stop = watch.diverged()
        if stop is not None:
            first, why = stop
            curve.diverged_at = curve.lrs[first]
            curve.reason = f"{why} at step {first} (lr={curve.lrs[first]:.3g})"
            break
    return curve


class DivergenceWatch:
    """The sweep's smoothing and stop test, fed one raw loss per step.

    add(loss) returns the bias-corrected EMA; diverged() then says whether the curve has diverged
    at the newest point: (index of the divergence point, why) or None. Diverged when either
    - the raw loss exceeded diverge_factor x its best on each of the last DIVERGE_RUN steps (the
      first of them is the divergence point). "Best" is the lowest median of DIVERGE_RUN
      consecutive raw losses (one lucky batch does not set it). The raw loss explodes well before
      the EMA notices: the EMA lags ~(1 - smoothing) / smoothing steps and its best is lagged
      upwards too, so on the digits CNN the smoothed test never fired while the raw loss went
      0.24 -> 7.7 (lr 0.07 -> 0.6); or
    - the smoothed loss exceeded diverge_factor x its best (the newest point), the classic test,
      which still catches a creep that never gives DIVERGE_RUN high batches in a row.
    Both "bests" count as at least START_FLOOR_FRACTION x the first losses: a loss that falls to
    ~0 (separable data) would otherwise "diverge" at 4 x 1e-6 on a few unlucky batches.
    """

    def __init__(self, smoothing: float, diverge_factor: float):
        self.beta, self.factor = 1.0 - smoothing, diverge_factor
        self.avg = 0.0
        self.losses: list[float] = []
        self.smoothed: list[float] = []
        self.best = math.inf  # lowest smoothed loss before the newest point
        self.best_raw = math.inf  # lowest median of DIVERGE_RUN consecutive raw losses before the newest point
        self.floor = LOSS_FLOOR

    def add(self, loss: float) -> float:
        if self.smoothed:  # fold the previous point into the bests: the newest is judged against the past
            self.best = min(self.best, self.smoothed[-1])
            if len(self.losses) >= DIVERGE_RUN:
                self.best_raw = min(self.best_raw, float(np.median(self.losses[-DIVERGE_RUN:])))
        self.losses.append(loss)
        if len(self.losses) == DIVERGE_RUN:
            self.floor = max(LOSS_FLOOR, START_FLOOR_FRACTION * float(np.median(self.losses)))
        self.avg = self.beta * self.avg + (1 - self.beta) * loss
        smooth = self.avg / (1 - self.beta ** len(self.losses))
        self.smoothed.append(smooth)
        return smooth

    def diverged(self) -> tuple[int, str] | None:
        i = len(self.losses) - 1
        limit = self.factor * max(self.best_raw, self.floor)
        if i >= DIVERGE_RUN and all(v > limit for v in self.losses[-DIVERGE_RUN:]):
            return i - DIVERGE_RUN + 1, (
                f"loss exceeded {self.factor:g} x its best {max(self.best_raw, self.floor):.4g} "
                f"(median of {DIVERGE_RUN} steps) for {DIVERGE_RUN} steps in a row, starting"
            )
        if i > 0 and self.smoothed[-1] > self.factor * max(self.best, self.floor):
            return i, f"smoothed loss {self.smoothed[-1]:.4g} exceeded {self.factor:g} x its best {self.best:.4g}"
        return None


def find_divergence(losses: list[float], smoothing: float = 0.05, diverge_factor: float = 4.0) -> tuple[int, str] | None:
    """Replay the sweep's stop test on a recorded raw-loss curve: (divergence index, why) or None."""
    watch = DivergenceWatch(smoothing, diverge_factor)
    for v in losses:
        watch.add(float(v))
        stop = watch.diverged()
        if stop is not None:
            return stop
    return None
