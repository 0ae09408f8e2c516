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

Suggestions (read off the smoothed curve -- the one plotted -- as a function of log10 LR, ignoring
the first 10% of the points (EMA warm-up, untrained-model noise) and the last 5% (the divergence
ramp)):
- min_loss_lr: LR at the lowest smoothed loss; THE suggestion is min_loss_lr / 10
  (`SUGGESTION_RULE` = "min_loss/10").
- steepest_lr: where d(smoothed loss)/d(log lr) is most negative.
- valley_lr: fastai's "valley" rule: the middle of the longest stretch over which the smoothed
  loss keeps falling (a longest decreasing subsequence).
`rule_suggestions` adds zero-lag variants and divergence LR / 10; all are logged.

Why min_loss/10 (bench/lr_rule.py; table in the README): on three experiments x three seeds
(digits CNN with AdamW, breast-cancer MLP with AdamW, wine MLP with SGD + Nesterov) against the
best LR of grids of full 12-epoch trainings (13 LRs over 4 decades), min_loss/10 was inside the
grid's good range (within one validation sample of the best accuracy) 9/9 times, its bounds held
the best LR 9/9 times, mean distance 0.46 decades. steepest did as well on average (0.47) but
missed once by 1.7 decades (a derivative at one point is noisy); divergence/10 was as good (0.41,
9/9) but needs the sweep to diverge within max_lr. valley -- the default until then -- sat
1.0-2.0 decades below the best LR in 7 of 9 cases (mean 1.28 decades; bounds held the best 2/9):
a full training with warm-up and cosine decay tolerates a much higher peak LR than the early part
of the sweep's descent suggests. The zero-lag (forward-backward EMA) variants land lower still.

No suggestion (None) with a `warning` when the curve carries no information: fewer than 10 points
before divergence, or a flat curve (the smoothed loss fell less than 5% of its start or less than
twice the batch-to-batch noise). A suggestion *with* a warning ("flagged") when it is usable but
shaky: a drop under 3x the noise (noisy curve), the loss still falling at max_lr, or the minimum
at the first usable point.

Bounds for a search space declared `from_lr_range_test: true` (`bounds_from_lr_range_test`):
    low  = suggestion / 10
    high = min(suggestion * 10, diverged_at_lr)      (suggestion * 10 when the sweep did not diverge)
    if high <= low (cannot happen with min_loss/10, whose x 10 is the minimum, before divergence): low = high / 10
A decade either side of the suggestion covers the rule's error (largest measured: 0.7 decades);
no LR at or above the point where the loss blew up is ever sampled. With min_loss/10 the high end
is the LR of the lowest loss itself.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from .batches import forever, to_device, train_batches
from .checkpoint import unwrap_model
from .config import TrainConfig
from .data import DataSplits
from .device import resolve_amp, resolve_device
from .optim import check_trainable_parameters
from .seeding import make_generator, seed_everything
from .step import TrainStep, make_train_step

SUGGESTION_RULE = "min_loss/10"  # see the module docstring and bench/lr_rule.py
SKIP_START_FRACTION = 0.10  # first points ignored by the suggestion rules (EMA warm-up, noise)
SKIP_END_FRACTION = 0.05  # last points ignored (the divergence ramp)
MIN_POINTS = 10  # fewer recorded points than this: no suggestion
FLAT_MIN_RELATIVE_DROP = 0.05  # the loss must fall by >= 5% of its start ...
FLAT_MIN_NOISE_MULTIPLE = 2.0  # ... and by >= 2x the batch-to-batch noise, or the curve is "flat"
# (pure noise exceeds 2x with probability < 1% -- simulated with Gaussian batch losses, 100 steps)
NOISY_NOISE_MULTIPLE = 3.0  # a drop under 3x the batch noise: suggestion given but flagged "noisy"
LOSS_FLOOR = 1e-6  # best losses below this count as this in the divergence test (avoid 4 x 0)
DIVERGE_RUN = 3  # raw-loss divergence: this many steps in a row above diverge_factor x best
START_FLOOR_FRACTION = 0.1  # divergence test: best loss counts as >= this x the first losses (median of DIVERGE_RUN)


@dataclass
class LRRangeResult:
    lrs: list[float]  # LR of each recorded sweep step (step i -> lrs[i])
    losses: list[float]  # raw training loss of each step (mean over its micro-batches), all finite
    smoothed: list[float]  # bias-corrected EMA of `losses`
    suggestion: float | None  # THE suggested peak LR (SUGGESTION_RULE), None when the curve says nothing
    steepest_lr: float | None
    valley_lr: float | None
    min_loss_lr: float | None
    diverged_at_lr: float | None  # LR at which the sweep stopped for divergence; None if it did not
    stopped_early: bool
    reason: str  # why the sweep ended, in words
    warning: str | None = None  # set when the suggestion is missing or shaky; say why
    suggestion_rule: str = SUGGESTION_RULE
    settings: dict[str, Any] = field(default_factory=dict)  # sweep + trainer settings, plain data
    seconds: float = 0.0  # wall time of the sweep

    @property
    def steps(self) -> list[int]:
        return list(range(len(self.lrs)))

    def to_dict(self) -> dict[str, Any]:
        """Plain data (picklable, JSON-able): what a child process sends back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LRRangeResult":
        return cls(**d)


# ---------------------------------------------------------------- arguments and the LR grid


def _check_args(min_lr: float, max_lr: float, num_steps: int, mode: str, smoothing: float, diverge_factor: float) -> None:
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


# ---------------------------------------------------------------- the sweep


@dataclass
class _Curve:
    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    diverged_at: float | None  # LR at which the sweep stopped for divergence
    reason: str | None  # why it stopped early; None when it ran every step


def _sweep(
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
    curve and the suggestions (see the module docstring for the rules).
    """
    _check_args(min_lr, max_lr, num_steps, mode, smoothing, diverge_factor)
    t0 = time.perf_counter()
    seed_everything(seed, deterministic=cfg.deterministic)
    device = resolve_device(cfg.device)
    amp = resolve_amp(cfg.amp, device)

    # ---- a private copy of the model: the caller's weights, buffers and flags stay as they are
    source = unwrap_model(model)
    check_trainable_parameters(source)
    net = copy.deepcopy(source).to(device)
    channels_last = cfg.channels_last and len(data.input_shape) == 3
    if channels_last:
        net.to(memory_format=torch.channels_last)
    net.train()

    # ---- the trainer's loss, optimizer, scaler and batches (no scheduler: the sweep sets the LR itself)
    lrs_planned = lr_schedule(min_lr, max_lr, num_steps, mode)
    bound = task.bind(cfg, data, device) if task is not None else None  # the task's loss (classification: None)
    step = make_train_step(cfg, data, net, device=device, amp=amp, lr=lrs_planned[0], bound=bound)
    if len(data.train) == 0:
        raise ValueError("the train split is empty")
    # fit()'s training batches (shuffled or balanced, drop_last), reshuffled when the split is exhausted
    batches = forever(train_batches(cfg, data, device, make_generator(seed), target_dtype=step.target_dtype))
    curve = _sweep(
        step, batches, lrs_planned, accum=cfg.grad_accum_steps, channels_last=channels_last, smoothing=smoothing, diverge_factor=diverge_factor
    )
    del net, step, batches

    settings = {
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


# ---------------------------------------------------------------- suggestion rules


def valley_index(values: np.ndarray) -> int:
    """fastai's valley rule: the middle of the longest decreasing run of `values`.

    lds[i] = length of the longest strictly decreasing subsequence ending at i; the longest one
    spans roughly [end - lds[end], end] and the index halfway along it is returned.
    """
    n = len(values)
    lds = [1] * n
    start = end = 0
    for i in range(1, n):
        for j in range(i):
            if values[i] < values[j] and lds[i] < lds[j] + 1:
                lds[i] = lds[j] + 1
        if lds[i] > lds[end]:
            end = i
            start = end - lds[end]
    third = (end - start) / 3
    return min(max(start + int(third) + int(third / 2), 0), n - 1)


def _noise_sigma(losses: np.ndarray) -> float:
    """Batch-to-batch noise of the raw loss: robust std of consecutive differences / sqrt(2)."""
    d = np.diff(losses)
    if len(d) < 2:
        return 0.0
    mad = np.median(np.abs(d - np.median(d)))
    return float(1.4826 * mad / math.sqrt(2))


def suggest(lrs: list[float], losses: list[float], smoothed: list[float], *, diverged: bool) -> dict[str, Any]:
    """The suggestion fields of an LRRangeResult from a recorded curve (see the module docstring)."""
    out: dict[str, Any] = {"suggestion": None, "steepest_lr": None, "valley_lr": None, "min_loss_lr": None, "warning": None}
    n = len(lrs)
    if n < MIN_POINTS:
        if diverged:
            where = f" (last recorded lr={lrs[-1]:.3g})" if n else ""
            out["warning"] = (
                f"only {n} point(s) recorded before the loss diverged{where}: nothing to suggest. "
                "Lower min_lr, or check that the model trains at all at a small LR."
            )
        else:
            out["warning"] = f"only {n} steps: too few to suggest an LR; use num_steps >= {MIN_POINTS} (100 is typical)"
        return out
    lr = np.asarray(lrs, dtype=np.float64)
    raw = np.asarray(losses, dtype=np.float64)
    sm = np.asarray(smoothed, dtype=np.float64)
    log_lr = np.log10(lr)
    lo = max(1, int(SKIP_START_FRACTION * n))
    hi = n - max(1, int(SKIP_END_FRACTION * n))  # exclusive
    if hi - lo < 3:
        out["warning"] = f"only {n} points recorded; too few to apply the suggestion rules"
        return out

    window = sm[lo:hi]
    # d loss / d log10(lr), central differences (np.gradient handles the uneven linear-mode grid)
    slope = np.gradient(sm, log_lr)[lo:hi]
    i_steep = lo + int(np.argmin(slope))
    i_valley = lo + valley_index(window)
    i_min = lo + int(np.argmin(window))
    out["steepest_lr"] = float(lr[i_steep])
    out["valley_lr"] = float(lr[i_valley])
    out["min_loss_lr"] = float(lr[i_min])

    # Flat curve: the loss never fell clearly below where it started.
    # Reference level: the loss before the LR had any effect -- the points at LRs within 10x of
    # min_lr (exp mode: the first ~10%; linear mode: only the first), at least 3 of them.
    k = max(3, min(lo, int(np.sum(lr <= 10 * lr[0]))))
    start = float(np.median(raw[:k]))
    drop = start - float(window.min())
    sigma = _noise_sigma(raw[: max(i_min + 1, MIN_POINTS)])  # up to the minimum: no divergence spikes
    needed = max(FLAT_MIN_RELATIVE_DROP * abs(start), FLAT_MIN_NOISE_MULTIPLE * sigma)
    if drop < needed or slope.min() >= 0:
        out["warning"] = (
            f"flat curve: the smoothed loss fell only {max(drop, 0.0):.3g} from {start:.4g} over "
            f"lr {lr[0]:.3g}..{lr[-1]:.3g} (needed {needed:.3g}: 5% of the start and 2x the batch noise "
            f"{sigma:.3g}); no LR is suggested. The model may not be learning (zero or detached gradients, "
            "frozen layers, wrong labels) or the LR range misses the useful region: widen min_lr..max_lr."
        )
        return out

    out["suggestion"] = {"min_loss/10": out["min_loss_lr"] / 10, "steepest": out["steepest_lr"], "valley": out["valley_lr"]}[SUGGESTION_RULE]
    warnings = []
    if drop < NOISY_NOISE_MULTIPLE * sigma:
        warnings.append(
            f"noisy curve: the loss fell by {drop:.3g}, only {drop / sigma:.1f}x the batch-to-batch noise "
            f"({sigma:.3g}); the suggestion is uncertain (a larger batch, more num_steps or more smoothing help)"
        )
    if not diverged and i_min >= hi - 1:
        warnings.append(
            f"the loss was still falling at the end of the sweep (max_lr={lr[-1]:.3g}): raise max_lr to see where it diverges"
        )
    if i_min <= lo:
        warnings.append("the lowest loss is at the first usable point: lower min_lr")
    if warnings:
        out["warning"] = "; ".join(warnings)
    return out


def zero_lag_smooth(losses: list[float] | np.ndarray, smoothing: float) -> np.ndarray:
    """The bias-corrected EMA run forward, then backward over that (no lag: a symmetric kernel)."""

    def ema(v: np.ndarray) -> np.ndarray:
        out, avg, beta = np.empty_like(v), 0.0, 1.0 - smoothing
        for i, x in enumerate(v):
            avg = beta * avg + smoothing * x
            out[i] = avg / (1 - beta ** (i + 1))
        return out

    v = np.asarray(losses, dtype=np.float64)
    return ema(ema(v)[::-1])[::-1]


def rule_suggestions(result: "LRRangeResult") -> dict[str, float | None]:
    """Every rule's LR for a recorded curve (None where a rule has nothing to say), the chosen one
    (SUGGESTION_RULE) among them. bench/lr_rule.py scores these against grids of full trainings;
    they are logged next to the suggestion so the comparison can be repeated on any experiment."""
    lrs, n = np.asarray(result.lrs, dtype=np.float64), len(result.lrs)
    out: dict[str, float | None] = {
        "min_loss/10": result.min_loss_lr / 10 if result.min_loss_lr else None,
        "steepest": result.steepest_lr,
        "valley": result.valley_lr,
        "steepest_zero_lag": None,
        "min_zero_lag/10": None,
        "diverged/10": result.diverged_at_lr / 10 if result.diverged_at_lr else None,
    }
    lo = max(1, int(SKIP_START_FRACTION * n))
    hi = n - max(1, int(SKIP_END_FRACTION * n))
    if n >= MIN_POINTS and hi - lo >= 3:
        # The same EMA run forward then backward: no lag, so these read the raw curve's shape.
        zl = zero_lag_smooth(result.losses, float(result.settings.get("smoothing", 0.05)))
        out["steepest_zero_lag"] = float(lrs[lo + int(np.argmin(np.gradient(zl, np.log10(lrs))[lo:hi]))])
        out["min_zero_lag/10"] = float(lrs[lo + int(np.argmin(zl[lo:hi]))]) / 10
    three = [v for v in (out["steepest"], out["min_loss/10"], out["diverged/10"]) if v is not None]
    out["median_of_3"] = float(np.exp(np.median(np.log(three)))) if three else None  # of steepest, min/10, diverged/10
    return out


# ---------------------------------------------------------------- search-space bounds


def bounds_from_lr_range_test(result: LRRangeResult) -> tuple[float, float]:
    """(low, high) for a `from_lr_range_test: true` search dimension.

    low = suggestion / 10; high = min(suggestion * 10, diverged_at_lr), or suggestion * 10 when
    the sweep did not diverge; low < high is guaranteed (low = high / 10 otherwise).
    """
    s = result.suggestion
    if s is None or not (s > 0 and math.isfinite(s)):
        raise ValueError(
            "the LR range test gave no suggestion"
            + (f" ({result.warning})" if result.warning else "")
            + "; give the search space explicit low/high instead of from_lr_range_test: true"
        )
    low = s / 10
    high = s * 10
    if result.diverged_at_lr is not None:
        high = min(high, result.diverged_at_lr)
    if not high > low:
        low = high / 10
    return float(low), float(high)
