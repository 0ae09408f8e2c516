"""Samplers and pruners by name, seeded from the study seed, built identically by every driver.

Lives in config/ because validating a spec means building them once (constructor errors become
spec problems); the driver builds them from here too.

Optuna stores neither in the database, so each driver that joins a study builds them from the
spec; that is what makes every worker prune the same way.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import optuna

# Several samplers/pruners we expose by name (qmc, patient, wilcoxon, ...) are marked experimental
# by Optuna; users chose them by name in a spec, so the warning is noise on every run.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


SAMPLERS: dict[str, Callable[..., optuna.samplers.BaseSampler]] = {
    "tpe": optuna.samplers.TPESampler,
    "random": optuna.samplers.RandomSampler,
    "cmaes": optuna.samplers.CmaEsSampler,
    "gp": optuna.samplers.GPSampler,
    "qmc": optuna.samplers.QMCSampler,
    "grid": optuna.samplers.GridSampler,
    # several objectives (tpe and gp handle them too; every sampler reads trials' constraints)
    "nsgaii": optuna.samplers.NSGAIISampler,
    "nsgaiii": optuna.samplers.NSGAIIISampler,
}

PRUNERS: dict[str, Callable[..., optuna.pruners.BasePruner]] = {
    "none": optuna.pruners.NopPruner,
    "median": optuna.pruners.MedianPruner,
    "percentile": optuna.pruners.PercentilePruner,
    "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
    "hyperband": optuna.pruners.HyperbandPruner,
    "threshold": optuna.pruners.ThresholdPruner,
    "patient": optuna.pruners.PatientPruner,
    "wilcoxon": optuna.pruners.WilcoxonPruner,
}


SEED_MODULUS = 2**32  # numpy's RandomState (behind every Optuna sampler) takes seeds below 2**32


def combine_seed(base_seed: int, offset: int) -> int:
    """The sampler seed: the spec's (or the user's own `sampler.kwargs.seed`) plus the offset, in range."""
    return (int(base_seed) + int(offset)) % SEED_MODULUS


def sampler_seed(spec, seed_offset: int = 0) -> int | None:
    """The seed a driver's sampler gets. A user's own sampler.kwargs.seed replaces the spec's seed, not
    the offset: with it, a re-run and a second worker still draw new points (an explicit null keeps
    Optuna's unseeded sampler: None)."""
    own = spec.sampler.kwargs.get("seed", spec.seed)
    return None if own is None else combine_seed(own, seed_offset)


def make_sampler(spec, seed_offset: int = 0) -> optuna.samplers.BaseSampler:
    """`seed_offset` keeps a resumed study (or a second worker) from replaying the same draws:
    a sampler seeded identically in a new process would propose the very same parameters again."""
    kind = spec.sampler.type
    kwargs: dict[str, Any] = dict(spec.sampler.kwargs)
    if kind == "grid":
        kwargs.setdefault("search_space", _grid_space(spec))
    if kwargs.get("seed", 0) is not None:
        kwargs["seed"] = sampler_seed(spec, seed_offset)
    return SAMPLERS[kind](**kwargs)


def _grid_space(spec) -> dict[str, list]:
    space = {}
    for path, dist in spec.search_space.items():
        if getattr(dist, "type", None) != "categorical":  # (duck-typed: spec.py imports this module)
            raise ValueError(f"search_space.{path}: the grid sampler needs categorical entries (or sampler.kwargs.search_space)")
        space[path] = list(dist.choices)
    return space


def make_pruner(spec) -> optuna.pruners.BasePruner:
    kind = spec.pruner.type
    kwargs: dict[str, Any] = dict(spec.pruner.kwargs)
    if kind == "patient":
        # patient wraps another pruner: {type: patient, kwargs: {patience: 2, wrapped: {type: median, kwargs: {...}}}}
        wrapped = kwargs.pop("wrapped", None) or {"type": "none"}
        inner_kind = wrapped.get("type", "none")
        inner = PRUNERS[inner_kind](**wrapped.get("kwargs", {})) if inner_kind != "none" else None
        return optuna.pruners.PatientPruner(inner, **kwargs)
    return PRUNERS[kind](**kwargs)


def check_named(spec) -> list[str]:
    """Build the sampler and pruner once, turning any constructor error into a spec problem."""
    problems = []
    if spec.sampler.type not in SAMPLERS:
        problems.append(f"sampler.type: unknown sampler {spec.sampler.type!r}; use one of {', '.join(SAMPLERS)}")
    elif getattr(spec, "is_multi_objective", False) and spec.sampler.type == "cmaes":
        problems.append("sampler.type: cmaes optimises one objective; for several use nsgaii, nsgaiii, tpe, gp or random")
    else:
        problems += _constructor_problems("sampler", spec.sampler.type, lambda: make_sampler(spec))
    if spec.pruner.type not in PRUNERS:
        problems.append(f"pruner.type: unknown pruner {spec.pruner.type!r}; use one of {', '.join(PRUNERS)}")
        return problems
    wrapped = spec.pruner.kwargs.get("wrapped") if spec.pruner.type == "patient" else None
    if wrapped is not None and (not isinstance(wrapped, dict) or wrapped.get("type", "none") not in PRUNERS):
        problems.append(f"pruner.kwargs.wrapped: needs {{type: <one of {', '.join(PRUNERS)}>, kwargs: {{...}}}}")
    else:
        problems += _constructor_problems("pruner", spec.pruner.type, lambda: make_pruner(spec))
    return problems


def _constructor_problems(section: str, kind: str, build: Callable[[], Any]) -> list[str]:
    try:
        build()
    except (TypeError, ValueError) as e:
        return [f"{section}.kwargs: {kind} rejects them: {e}"]
    return []
