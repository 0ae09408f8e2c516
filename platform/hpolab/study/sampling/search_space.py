"""The spec's search space as Optuna distributions (fixed per trial: `study.ask(fixed_distributions=...)`)."""

from __future__ import annotations

from typing import Any

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from hpolab.config.spec import CategoricalDist, FloatDist, IntDist, StudySpec


def optuna_distributions(spec: StudySpec, lr_bounds: tuple[float, float] | None = None) -> dict[str, Any]:
    """`lr_bounds`: the LR range test's (low, high), for the entries with `from_lr_range_test`."""
    dists: dict[str, Any] = {}
    for path, d in spec.search_space.items():
        if isinstance(d, FloatDist):
            low, high = (d.low, d.high) if not d.from_lr_range_test else (lr_bounds or (None, None))
            if low is None:
                raise RuntimeError(f"search_space.{path} needs the LR range test result, which is missing")
            dists[path] = FloatDistribution(low, high, log=d.log, step=d.step)
        elif isinstance(d, IntDist):
            dists[path] = IntDistribution(d.low, d.high, log=d.log, step=d.step)
        elif isinstance(d, CategoricalDist):
            dists[path] = CategoricalDistribution(d.choices)
    return dists
