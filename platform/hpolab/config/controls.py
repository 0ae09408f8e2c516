"""Study-level controls in the spec: `enqueue:` (known-good configurations evaluated first),
`stop_after_no_improvement:` (stop the study when it has stopped getting better), and durations
(`timeout: 2h`).

Kept apart from spec.py so the spec stays the list of fields; this module checks the values.
It reads the search-space entries by their `type` (float | int | categorical) and imports nothing
of spec.py (which imports it).
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator


class NoImprovementStop(BaseModel):
    """`stop_after_no_improvement: {trials: N, min_delta: 0.0}`, or just `stop_after_no_improvement: N`.

    The study starts no new trial once `trials` finished trials in a row (COMPLETE or PRUNED, in
    the order they finished) brought no improvement larger than `min_delta` (in the metric's
    units) over the best value so far.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    trials: int = Field(ge=1)  # finished trials in a row without an improvement
    min_delta: float = Field(default=0.0, ge=0)  # an improvement must exceed this (metric units)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("give a number of trials (stop_after_no_improvement: 5) or {trials: 5, min_delta: 0.001}")
        return {"trials": v} if isinstance(v, int) else v


def check_enqueue(search_space: Mapping[str, Any], entries: list[Any]) -> list[str]:
    """Every problem of the `enqueue:` entries, as 'enqueue[i].path: message' lines."""
    problems: list[str] = []
    for i, entry in enumerate(entries):
        where = f"enqueue[{i}]"
        if not isinstance(entry, dict) or not entry:
            problems.append(f"{where}: give a mapping of search_space paths to values, e.g. {{trainer.lr: 0.001}}")
            continue
        for path, value in entry.items():
            dist = search_space.get(path)
            if dist is None:
                known = ", ".join(search_space) or "none: the search space is empty"
                problems.append(f"{where}.{path}: not in search_space (searched: {known})")
                continue
            why = outside(dist, value)
            if why:
                problems.append(f"{where}.{path}: {why}")
    return problems


def outside(dist: Any, value: Any) -> str | None:
    """Why `value` cannot be a sample of the spec's distribution `dist`; None when it can.

    Bounds that come from the LR range test are unknown here; the study checks them once it has them.
    """
    if dist.type == "categorical":
        if any(type(value) is type(c) and value == c for c in dist.choices):
            return None
        return f"{value!r} is not one of the choices {dist.choices}"
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if dist.type == "int" and not (is_number and float(value).is_integer()):
        return f"{value!r} is not an integer"
    if not is_number or not math.isfinite(value):
        return f"{value!r} is not a number"
    if dist.type == "float" and dist.from_lr_range_test:
        return None if value > 0 else f"{value!r} must be > 0 (an LR)"
    if not dist.low <= value <= dist.high:
        return f"{value!r} is outside [{dist.low!r}, {dist.high!r}]"
    step = dist.step
    if step is not None and not dist.log:
        k = (value - dist.low) / step
        if abs(k - round(k)) > 1e-8:
            return f"{value!r} is not on the grid low + k * step ({dist.low!r} + k * {step!r})"
    return None


_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d*)?)\s*d)?\s*(?:(\d+(?:\.\d*)?)\s*h)?\s*(?:(\d+(?:\.\d*)?)\s*m)?\s*(?:(\d+(?:\.\d*)?)\s*s)?\s*$")


def seconds_of(value: Any) -> Any:
    """`timeout:` / `trial_timeout:` as seconds: a number stays as given; a duration string such as
    "90s", "30m", "2h", "1h30m" or "1d" becomes its seconds. Any other string: ValueError."""
    if not isinstance(value, str):
        return value
    m = _DURATION.match(value)
    if not value.strip() or m is None or not any(m.groups()):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{value!r}: give seconds (7200) or a duration such as 90s, 30m, 2h, 1h30m") from None
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
