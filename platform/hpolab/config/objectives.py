"""What a study optimises: one objective or several, constraints, and the metric the pruner watches.

    objectives:                      # several: a Pareto front (Optuna's multi-objective study)
      - {metric: val_acc, direction: maximize}
      - {metric: latency_ms, direction: minimize}
    pruning: {metric: val_acc}       # the objective reported each epoch (default: the first epoch metric)
    constraints:                     # feasible trials only make the front / the best
      - {metric: params, max: 1.0e6}

The single `metric` + `direction` stays valid and means a one-item list. The study's "primary"
metric (what the training routine picks its best epoch by, early-stops and prunes on) is the
pruning metric; a trial's value of an epoch metric is its value at that best epoch.

Cost metrics need no user code: the trial process measures them after training (train/costs.py).
An experiment may add its own, measured the same way (once, after training):

    COSTS = {"mflops": "minimize"}                      # name -> direction
    def costs(model, example) -> dict[str, float]:     # model in eval mode; example: a batch of inputs
        return {"mflops": ...}                          # on the model's device
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Measured on the trained model, not per epoch: what "smaller" or "faster" means for a second objective.
COST_METRICS = {
    "params": "trainable parameters",
    "model_mb": "parameters + buffers in MiB",
    "latency_ms": "median batch-1 inference time on the trial's device, warm-up excluded",
}


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Objective(_Frozen):
    metric: str
    direction: Literal["maximize", "minimize"]


class Pruning(_Frozen):
    metric: str


class Constraint(_Frozen):
    """A bound on a metric: `max` (value <= max) or `min` (value >= min), not both."""

    metric: str
    max: float | None = None
    min: float | None = None

    @model_validator(mode="after")
    def _one_bound(self) -> "Constraint":
        if (self.max is None) == (self.min is None):
            raise ValueError(f"constraint on {self.metric}: give exactly one of max or min")
        return self

    def violation(self, value: float) -> float:
        """Optuna's convention: <= 0 feasible, > 0 by how much it is violated."""
        return value - self.max if self.max is not None else self.min - value

    def describe(self) -> str:
        return f"{self.metric} <= {self.max:g}" if self.max is not None else f"{self.metric} >= {self.min:g}"


def fill_primary(data: Any) -> Any:
    """Before validation: a spec with `objectives:` gets `metric`/`direction` = its primary (the
    pruning metric), so the training routine and every single-metric reader see one metric.
    Problems raise ValueError (pydantic reports them at the top level)."""
    if not isinstance(data, dict) or data.get("objectives") is None:
        if isinstance(data, dict) and data.get("pruning") is not None:
            raise ValueError("pruning: names one of several objectives; without objectives: the study metric is pruned on")
        return data
    objectives = data["objectives"]
    if not isinstance(objectives, list) or not objectives or not all(isinstance(o, dict) for o in objectives):
        raise ValueError("objectives: a list of {metric: NAME, direction: maximize|minimize}")
    if "metric" in data or "direction" in data:
        raise ValueError("objectives: give objectives: or metric:/direction:, not both (one objective is a one-item list)")
    names = [o.get("metric") for o in objectives]
    if len(set(names)) != len(names):
        raise ValueError(f"objectives: each metric once, got {names}")
    pruning = data.get("pruning")
    if pruning is not None:
        wanted = pruning.get("metric") if isinstance(pruning, dict) else None
        if wanted not in names:
            raise ValueError(f"pruning.metric: {wanted!r} is not an objective; use one of {', '.join(map(str, names))}")
        if wanted in COST_METRICS:
            raise ValueError(f"pruning.metric: {wanted} is measured once after training, not each epoch; prune on an epoch metric")
    else:
        wanted = next((n for n in names if n not in COST_METRICS), None)
        if wanted is None:
            raise ValueError(f"objectives: at least one must be an epoch metric (not only {', '.join(COST_METRICS)}): "
                             "training picks its best epoch by it")
    primary = objectives[names.index(wanted)]
    return {**data, "metric": wanted, "direction": primary.get("direction")}


COST_NAME = re.compile(r"^[A-Za-z_][\w.]*$")  # usable as an MLflow metric and in a --pick rule


def declared_costs(experiment) -> dict[str, str]:
    """The experiment's own cost metrics: its COSTS (name -> direction) with a valid direction, {}
    when it declares none (experiment_cost_problems says what is wrong with the rest)."""
    declared = getattr(experiment, "COSTS", None)
    if not isinstance(declared, dict):
        return {}
    return {k: v for k, v in declared.items() if isinstance(k, str) and v in ("maximize", "minimize")}


def experiment_cost_problems(experiment, epoch_direction) -> list[str]:
    """COSTS is a {name: maximize|minimize} mapping with a costs(model, example) function, and its
    names are not already built-in cost metrics or epoch metrics of the task."""
    declared = getattr(experiment, "COSTS", None)
    if declared is None:
        return []
    if not isinstance(declared, dict) or not all(isinstance(k, str) and v in ("maximize", "minimize") for k, v in declared.items()):
        return [f"experiment: COSTS must map each cost metric's name to maximize or minimize, got {declared!r}"]
    problems = [f"experiment: COSTS: {name!r} is not a usable metric name; use letters, digits, '_' and '.'"
                for name in declared if not COST_NAME.match(name)]
    if not callable(getattr(experiment, "costs", None)):
        problems.append("experiment: COSTS is declared but there is no costs(model, example) -> dict function to measure them")
    for name in declared:
        if name in COST_METRICS or epoch_direction(name) is not None:
            problems.append(f"experiment: COSTS: {name!r} is already a {'built-in cost' if name in COST_METRICS else 'epoch'} "
                            "metric; give yours another name")
    return problems


def objective_problems(spec, epoch_direction, costs: dict[str, str] | None = None) -> list[str]:
    """Every objective and constraint names a metric the task produces or a cost metric (built in,
    or the experiment's own `costs`: name -> direction), for a spec with `objectives:` or
    `constraints:`; a one-metric spec's metric is checked by the task's metric_problems.
    `epoch_direction(metric)`: the task's direction of an epoch metric, None when it has none."""
    costs = costs or {}
    known = ", ".join([*COST_METRICS, *costs])
    problems = []
    for i, o in enumerate(spec.objectives or []):
        if o.metric in COST_METRICS:
            continue
        want = costs.get(o.metric) or epoch_direction(o.metric)
        if want is None:
            problems.append(f"objectives.{i}.metric: {o.metric!r} is not a metric of this task nor a cost metric ({known})")
        elif o.direction != want:
            problems.append(f"objectives.{i}.direction: {o.metric} should be {want[:-1]}ed; set direction: {want}")
    if spec.objectives and spec.metric in costs:
        problems.append(f"pruning.metric: {spec.metric} is the experiment's cost metric, measured once after training; "
                        "prune on an epoch metric (set pruning: {metric: ...} or list an epoch metric first)")
    for i, c in enumerate(spec.constraints):
        if c.metric not in COST_METRICS and c.metric not in costs and epoch_direction(c.metric) is None:
            problems.append(f"constraints.{i}.metric: {c.metric!r} is not a metric of this task nor a cost metric ({known})")
    stop = spec.stop_after_no_improvement
    if spec.is_multi_objective and stop is not None and stop.min_delta != 0:
        problems.append("stop_after_no_improvement.min_delta: with several objectives a trial improves when it joins the "
                        "Pareto front (there is no one value to exceed); remove min_delta")
    for key in ("stop_when_converged", "noise_probe"):  # (one noise floor, of one metric: study/objectives/noise.py)
        if spec.is_multi_objective and getattr(spec, key) is not None:
            problems.append(f"{key}: works on one objective's noise floor; a study of several objectives cannot use it yet")
    return problems


def measured_metrics(spec, costs: dict[str, str] | None = None) -> list[str]:
    """The cost metrics a trial must measure (its objectives' and constraints'): built-in ones
    first, then the experiment's own (`costs`: its COSTS)."""
    names = [o.metric for o in spec.objectives or []] + [c.metric for c in spec.constraints]
    return [n for n in [*COST_METRICS, *(costs or {})] if n in names]


class WarmStart(BaseModel):
    """Start from an earlier study in the same store (study/sampling/warm_start.py): enqueue its `top_k` best
    configurations, and with `import_trials` add its finished trials to the sampler's history."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)
    from_: str = Field(alias="from", min_length=1)  # a study name, or its spec file
    top_k: int = Field(default=5, ge=0)
    import_trials: bool = False
