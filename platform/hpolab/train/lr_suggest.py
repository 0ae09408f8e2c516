"""The LR range test's suggestion rules, read off a recorded curve, and the search-space bounds
derived from the suggestion; `LRRangeResult` is the curve with its suggestions.

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

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

SUGGESTION_RULE = "min_loss/10"  # see the module docstring and bench/lr_rule.py
SKIP_START_FRACTION = 0.10  # first points ignored by the suggestion rules (EMA warm-up, noise)
SKIP_END_FRACTION = 0.05  # last points ignored (the divergence ramp)
MIN_POINTS = 10  # fewer recorded points than this: no suggestion
FLAT_MIN_RELATIVE_DROP = 0.05  # the loss must fall by >= 5% of its start ...
FLAT_MIN_NOISE_MULTIPLE = 2.0  # ... and by >= 2x the batch-to-batch noise, or the curve is "flat"
# (pure noise exceeds 2x with probability < 1% -- simulated with Gaussian batch losses, 100 steps)
NOISY_NOISE_MULTIPLE = 3.0  # a drop under 3x the batch noise: suggestion given but flagged "noisy"


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
        out["warning"] = _too_few_warning(lrs, diverged)
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
    warning = _shaky_warning(drop, sigma, float(lr[-1]), diverged=diverged, i_min=i_min, lo=lo, hi=hi)
    if warning:
        out["warning"] = warning
    return out


def _too_few_warning(lrs: list[float], diverged: bool) -> str:
    n = len(lrs)
    if diverged:
        where = f" (last recorded lr={lrs[-1]:.3g})" if n else ""
        return (
            f"only {n} point(s) recorded before the loss diverged{where}: nothing to suggest. "
            "Lower min_lr, or check that the model trains at all at a small LR."
        )
    return f"only {n} steps: too few to suggest an LR; use num_steps >= {MIN_POINTS} (100 is typical)"


def _shaky_warning(drop: float, sigma: float, last_lr: float, *, diverged: bool, i_min: int, lo: int, hi: int) -> str | None:
    """Why a suggestion that was given is shaky (noisy curve, still falling at max_lr, minimum at the start), or None."""
    warnings = []
    if drop < NOISY_NOISE_MULTIPLE * sigma:
        warnings.append(
            f"noisy curve: the loss fell by {drop:.3g}, only {drop / sigma:.1f}x the batch-to-batch noise "
            f"({sigma:.3g}); the suggestion is uncertain (a larger batch, more num_steps or more smoothing help)"
        )
    if not diverged and i_min >= hi - 1:
        warnings.append(
            f"the loss was still falling at the end of the sweep (max_lr={last_lr:.3g}): raise max_lr to see where it diverges"
        )
    if i_min <= lo:
        warnings.append("the lowest loss is at the first usable point: lower min_lr")
    return "; ".join(warnings) if warnings else None


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
