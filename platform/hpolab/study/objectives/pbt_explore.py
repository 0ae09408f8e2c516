"""PBT's explore step: a new value for one mutated config key (Jaderberg et al. 2017; Ray Tune's rules).

    factor: [a, b]    multiply the value by a or b (one of them, at random)
    choices: [...]    move to a neighbouring choice (one step left or right, clamped at the ends)
    range: [lo, hi]   multiply by 0.8 or 1.2, clamped into [lo, hi]
With `resample_probability` the value is redrawn instead: from the key's search-space distribution
when the key is searched, else uniformly from the range / choices; a `factor` key that is not
searched has nothing to redraw from and is perturbed.

Pure functions of (current value, mutation, distribution, a seeded random.Random): the same
decision on every worker and on a re-run.
"""

from __future__ import annotations

import math
import random
from typing import Any

RANGE_FACTORS = (0.8, 1.2)  # a range key's perturbation (Ray Tune's)


def resample(dist: Any, mutation: Any, rng: random.Random) -> tuple[bool, Any]:
    """(whether a value could be drawn, the value): from the search-space distribution first."""
    if dist is not None:
        return True, _draw(dist, rng)
    if getattr(mutation, "range", None) is not None:
        lo, hi = mutation.range
        return True, rng.uniform(lo, hi)
    if getattr(mutation, "choices", None) is not None:
        return True, rng.choice(list(mutation.choices))
    return False, None


def _draw(dist: Any, rng: random.Random) -> Any:
    """One value of an Optuna distribution (Float / Int / Categorical)."""
    if hasattr(dist, "choices"):
        return rng.choice(list(dist.choices))
    low, high, log = dist.low, dist.high, getattr(dist, "log", False)
    if log:
        value = math.exp(rng.uniform(math.log(low), math.log(high)))
    else:
        value = rng.uniform(low, high)
    step = getattr(dist, "step", None)
    if step:
        value = low + round((value - low) / step) * step
    if isinstance(low, int) and isinstance(high, int) and not isinstance(low, bool):
        value = int(round(value))
    return min(max(value, low), high)


def perturb(value: Any, mutation: Any, rng: random.Random) -> Any:
    """The perturbed value (explore without resampling)."""
    if getattr(mutation, "choices", None) is not None:
        choices = list(mutation.choices)
        if value not in choices:
            return rng.choice(choices)
        i = choices.index(value) + rng.choice((-1, 1))
        return choices[min(max(i, 0), len(choices) - 1)]
    if getattr(mutation, "range", None) is not None:
        lo, hi = mutation.range
        return _like(value, min(max(value * rng.choice(RANGE_FACTORS), lo), hi))
    return _like(value, value * rng.choice(tuple(mutation.factor)))


def _like(old: Any, new: float) -> Any:
    """An int key stays an int (a batch size times 1.25 is rounded; never below 1)."""
    if isinstance(old, int) and not isinstance(old, bool):
        return max(1, int(round(new)))
    return float(new)


def explore(value: Any, mutation: Any, dist: Any, resample_probability: float, rng: random.Random) -> Any:
    """The new value of one key: redrawn with `resample_probability`, else perturbed."""
    if rng.random() < resample_probability:
        drawn, new = resample(dist, mutation, rng)
        if drawn:
            return new
    return perturb(value, mutation, rng)
