"""The study's noise floor: how far its metric moves when one configuration is trained again on
another training seed, as a promotion race (registry/race.py) or the study's noise probe
(study/sampling/noise_probe.py) measured it.

Kept as the Optuna study user attr NOISE_FLOOR: {"value": the pooled standard deviation over seeds
within each configuration (metric units), "metric", "source": "race" | "noise_probe", "dof": its
degrees of freedom, ...}. Readers: `study status`, `compare` (trials within the noise of the best are
marked tied: ranking.within_noise), the report (a band on the optimisation history), and
`stop_after_no_improvement: {min_delta: noise}` / `stop_when_converged`. Plain data: no Optuna here
(the light read paths import it).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

NOISE_FLOOR = "hpolab.noise_floor"
RACE_ATTR = "hpolab.race"  # Optuna study user attr: the study's latest finished promotion race, compact (the report's)


def noise_floor(user_attrs: Mapping[str, Any]) -> float | None:
    """The study's measured noise floor (None: none measured yet)."""
    record = user_attrs.get(NOISE_FLOOR)
    value = record.get("value") if isinstance(record, dict) else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def describe(user_attrs: Mapping[str, Any]) -> str | None:
    """'0.0042 (sd of val_acc over training seeds, 12 dof; a promotion race: 15 runs of 3 configurations)'."""
    record = user_attrs.get(NOISE_FLOOR)
    value = noise_floor(user_attrs)
    if value is None:
        return None
    how = "a promotion race" if record.get("source") == "race" else "the noise probe"
    return (f"{value:.4g} (sd of {record.get('metric')} over training seeds, {record.get('dof')} dof; "
            f"{how}: {record.get('runs')} runs of {record.get('configurations')} configurations)")


def pooled_sd(groups: Iterable[Iterable[float]]) -> tuple[float | None, int]:
    """(the pooled standard deviation of values within each group, its degrees of freedom); (None, 0)
    without a group of two finite values."""
    ss, dof = 0.0, 0
    for g in groups:
        v = [float(x) for x in g if x is not None and math.isfinite(x)]
        if len(v) >= 2:
            m = sum(v) / len(v)
            ss += sum((x - m) ** 2 for x in v)
            dof += len(v) - 1
    return (math.sqrt(ss / dof), dof) if dof else (None, 0)
