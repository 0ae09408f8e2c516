"""The spec's `enqueue:` entries: known-good configurations, evaluated before any sampled trial.

Each entry becomes a WAITING Optuna trial (`study.enqueue_trial(params, skip_if_exists=True)`); the
next `study.ask` takes it, so it runs before the sampler proposes anything. Done on every run under
the study's budget lock, which makes it idempotent: an entry already in the study (in any state,
even FAIL) is skipped, so re-runs and extra workers never repeat it, and entries added to the spec
later are queued on the next run. Only as many entries are queued as the `n_trials` budget has room
for (a WAITING trial is always started, so queuing more would overshoot it); the rest wait for a
run with a larger n_trials.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import optuna

from hpolab.config.spec import StudySpec
from hpolab.errors import SpecError
from hpolab.stores.budget_lock import budget_lock
from hpolab.stores.trial_counts import in_budget
from hpolab.study.state.budget import trial_counts
from hpolab.study.sampling.search_space import optuna_distributions


def enqueue_known_good(study: optuna.Study, storage, spec: StudySpec, lr_bounds: tuple[float, float] | None,
                       note: Callable[[str], None]) -> int:
    """Queue the spec's entries not yet in the study; returns how many were queued."""
    if not spec.enqueue:
        return 0
    entries = [typed_params(spec, entry, lr_bounds, i) for i, entry in enumerate(spec.enqueue)]
    queued = waiting_for_budget = 0
    with budget_lock(storage, spec.name):
        counts = trial_counts(study)
        room = spec.n_trials - in_budget(counts)
        for params in entries:
            if already_in(study, params):
                continue
            if queued >= room:
                waiting_for_budget += 1
                continue
            study.enqueue_trial(params, skip_if_exists=True)
            queued += 1
    if queued:
        note(f"enqueue: {queued} configuration{'s' * (queued > 1)} from the spec will run before any sampled trial")
    if waiting_for_budget:
        note(f"enqueue: {waiting_for_budget} more wait{'s' * (waiting_for_budget == 1)} for a larger n_trials (now {spec.n_trials})")
    return queued


def already_in(study: optuna.Study, params: dict[str, Any]) -> bool:
    """Whether a trial (any state) was enqueued or sampled with exactly these params: the rule of
    Optuna's `enqueue_trial(..., skip_if_exists=True)`, asked first so the budget check can count it."""
    for t in study.get_trials(deepcopy=False):
        seen = t.system_attrs.get("fixed_params", t.params)
        if seen.keys() == params.keys() and all(_same(seen[k], v) for k, v in params.items()):
            return True
    return False


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


def typed_params(spec: StudySpec, entry: dict[str, Any], lr_bounds: tuple[float, float] | None, index: int) -> dict[str, Any]:
    """An entry with floats as floats (YAML `0` is an int; Optuna compares types when it skips
    repeats), checked against the bounds the study now has (those from the LR range test included)."""
    dists = optuna_distributions(spec, lr_bounds)
    out = {}
    for path, value in entry.items():
        d = dists[path]
        if isinstance(d, optuna.distributions.FloatDistribution):
            value = float(value)
        if not d._contains(d.to_internal_repr(value)):  # Optuna's own check of a fixed param
            raise SpecError(f"enqueue[{index}]", [f"enqueue[{index}].{path}: {value!r} is outside {d}"])
        out[path] = value
    return out
