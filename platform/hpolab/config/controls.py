"""Study-level controls in the spec: `enqueue:` (known-good configurations evaluated first),
`stop_after_no_improvement:` and `stop_when_converged:` (stop the study when it has stopped getting
better), `noise_probe:` (measure the metric's noise over seeds during the study), `promotion:` (the
defaults of `hpolab promote`'s race) and durations (`timeout: 2h`).

Kept apart from spec.py so the spec stays the list of fields; this module checks the values.
It reads the search-space entries by their `type` (float | int | categorical) and imports nothing
of spec.py (which imports it).
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator


class NoImprovementStop(BaseModel):
    """`stop_after_no_improvement: {trials: N, min_delta: 0.0}`, or just `stop_after_no_improvement: N`.

    The study starts no new trial once `trials` finished trials in a row (COMPLETE or PRUNED, in
    the order they finished) brought no improvement larger than `min_delta` (in the metric's
    units) over the best value so far.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    trials: int = Field(ge=1)  # finished trials in a row without an improvement
    # an improvement must exceed this (metric units); `noise`: the study's measured noise floor (a
    # promotion race's or noise_probe's; 0 until one is measured)
    min_delta: float | Literal["noise"] = Field(default=0.0)

    @model_validator(mode="after")
    def _delta(self) -> "NoImprovementStop":
        if self.min_delta != "noise" and self.min_delta < 0:
            raise ValueError(f"min_delta must be >= 0 or noise, got {self.min_delta}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("give a number of trials (stop_after_no_improvement: 5) or {trials: 5, min_delta: 0.001}")
        return {"trials": v} if isinstance(v, int) else v


class ConvergedStop(BaseModel):
    """`stop_when_converged: {threshold: 0.05, window: 20, min_trials: 20}`: stop the study once the
    chance that an unseen configuration beats the incumbent by more than the noise floor is below
    `threshold` (study/objectives/convergence.py says how it is estimated). Needs a measured noise
    floor (noise_probe, or an earlier promotion race); until there is one the study does not stop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(default=0.05, gt=0, lt=1, description="stop when P(an unseen configuration beats the best by more than the noise) is below this")
    window: int = Field(default=20, ge=3, description="the latest finished trials the estimate is made from")
    min_trials: int = Field(default=20, ge=1, description="finished trials before the study may stop")


class NoiseProbe(BaseModel):
    """`noise_probe: {seeds: 3, every: 25}`: after every `every` finished trials, the best trial so far
    is trained again on `seeds` new seeds, as extra trials marked as such (never the best, outside
    n_trials); their spread is the study's noise floor (study/sampling/noise_probe.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seeds: int = Field(default=3, ge=1, description="new seeds per probe of the incumbent")
    every: int = Field(default=25, ge=1, description="finished trials between probes")


class Promotion(BaseModel):
    """`promotion: {race: true, race_top: 3, race_seeds: 5}`: the defaults of `hpolab promote`'s race
    (its --race-top, --race-seeds, --no-race override them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    race: bool = Field(default=True, description="race the leaders on fresh seeds before the held-out gate")
    race_top: int = Field(default=3, ge=1, description="candidates: the top K trials (and the champion's configuration)")
    race_seeds: int = Field(default=5, ge=2, description="the race's seed budget: seeds per candidate at most")


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
