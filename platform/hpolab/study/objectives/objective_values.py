"""A finished trial's objective values, constraints and cost metrics, into Optuna (and MLflow tags).

For a study with `objectives:` or `constraints:` (config/objectives.py) the trial process sends
every epoch metric at its best epoch and the cost metrics it measured (trial_process.py). Here:
- each constraint becomes Optuna's own (`trial.set_constraint`, <= 0 feasible): samplers steer by
  it, and `best_trial`/`best_trials` keep to feasible trials;
- the values are kept on the trial as user attr `hpolab.objectives` (also for PRUNED trials, whose
  Optuna values are none with several objectives) and on its MLflow run as metrics;
- what Optuna is told: one value, or one per objective in the spec's order.
"""

from __future__ import annotations

import math
from typing import Any, Callable

VALUES_ATTR = "hpolab.objectives"
FEASIBLE_TAG = "hpolab.feasible"


def record(spec, trial, measured: dict[str, float] | None, guard: Callable[..., Any]) -> dict[str, str]:
    """Set the trial's constraints and values attr; the MLflow tags that say so."""
    if not measured:
        return {}
    wanted = [o.metric for o in spec.objective_list] + [c.metric for c in spec.constraints]
    values = {m: measured[m] for m in wanted if m in measured}
    guard(trial.set_user_attr, VALUES_ATTR, values)
    tags = {}
    if spec.constraints:
        violations = {c.describe(): c.violation(values[c.metric]) for c in spec.constraints if c.metric in values}
        for name, v in violations.items():
            guard(trial.set_constraint, name, v if math.isfinite(v) else math.inf)
        broken = [name for name, v in violations.items() if not v <= 0]
        tags[FEASIBLE_TAG] = "false" if broken else "true"
        if broken:
            tags["hpolab.violated"] = "; ".join(broken)
    return tags


def optuna_values(spec, measured: dict[str, float] | None, primary: float) -> float | list[float]:
    """What `study.tell` gets for a COMPLETE trial."""
    if not spec.is_multi_objective:
        return primary
    return [float(measured[o.metric]) for o in spec.objective_list]


def not_finite(spec, values: float | list[float]) -> list[str]:
    """The objectives whose value is NaN or inf (Optuna would record FAIL)."""
    vals = values if isinstance(values, list) else [values]
    return [o.metric for o, v in zip(spec.objective_list, vals) if not math.isfinite(v)]
