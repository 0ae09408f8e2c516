"""Warm start: a new study begins from an earlier one in the same store, instead of cold.

    warm_start: {from: digits-cnn, top_k: 5}                   # or from: studies/digits_cnn.yaml
    warm_start: {from: digits-cnn, top_k: 0, import_trials: true}

- `top_k`: the earlier study's k best distinct configurations (ranking.py) are enqueued and run first, as
  real trials of this study (they count against n_trials). Only the parameters that exist in this
  search space and fit its distributions are kept; the rest are sampled.
- `import_trials`: the earlier study's COMPLETE trials are added to this study's history (Optuna's
  `add_trial`) so the sampler starts informed. They are marked (system attr `hpolab.imported_from`;
  the parent run's `hpolab.warm_start` tag), count against no budget, are never ranked, promoted or
  retained (ranking.py, budget.py), and have no MLflow run here (their runs stay in their study).
  Their values only mean the same thing if the objectives are the same: that is checked. Their
  constraints (Optuna's `constraints:<name>` system attrs, one per constraint, as the driver sets them)
  come along, so an infeasible trial stays infeasible to the sampler; that too needs the same
  constraints in both studies, which is checked.

It happens once per study (study user attr `hpolab.warm_start`), under the budget lock so two
workers starting together do not both do it. A missing source study, or one sharing no parameter
with this search space, is refused before the study is created (exit 2, nothing written).
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState, create_trial

from hpolab.config.objectives import Constraint
from hpolab.config.spec import study_name_from
from hpolab.errors import UserError
from hpolab.stores.budget_lock import budget_lock
from hpolab.stores.studies import is_companion
from hpolab.study.objectives import ranking
from hpolab.study.state import lifecycle
from hpolab.stores.trial_states import IMPORTED
from hpolab.study.sampling.search_space import optuna_distributions

DONE_ATTR = "hpolab.warm_start"


def _space(spec, lr: tuple[float, float] | None) -> dict[str, Any]:
    """This search space as Optuna distributions (entries waiting on the LR range test left out)."""
    try:
        return optuna_distributions(spec, lr)
    except RuntimeError:
        fixed = {k: d for k, d in spec.search_space.items() if not getattr(d, "from_lr_range_test", False)}
        return optuna_distributions(spec.model_copy(update={"search_space": fixed}), lr)


def _objectives_of(study: optuna.Study) -> list[str]:
    recorded = (study.user_attrs.get("hpolab.spec") or {}).get("metric")
    return list(study.metric_names or ([recorded] if recorded else []))


def _constraints_of(study: optuna.Study) -> set[str]:
    """The constraint names of a study: its recorded spec's, and any its finished trials carry."""
    recorded = (study.user_attrs.get("hpolab.spec") or {}).get("constraints") or []
    names = {Constraint(**c).describe() for c in recorded}
    return names | {k for t in ranking.ranked(study.get_trials(deepcopy=False), ranking.directions_of(study)) for k in t.constraints}


def _check_constraints(source: optuna.Study, spec) -> None:
    theirs, mine = _constraints_of(source), {c.describe() for c in spec.constraints}
    if theirs != mine:
        differ = sorted(theirs ^ mine)
        raise UserError(f"warm_start.import_trials: study {source.study_name!r} has constraints {', '.join(sorted(theirs)) or '(none)'}; "
                        f"study {spec.name!r} has {', '.join(sorted(mine)) or '(none)'} (differing: {', '.join(differ)}): imported "
                        "trials would be feasible or not by other bounds. Give both the same constraints, or use top_k alone "
                        "(its configurations are re-run)")


def check_source(storage, spec) -> optuna.Study | None:
    """The study to warm-start from (None: no warm start); UserError when it cannot be."""
    ws = spec.warm_start
    if ws is None:
        return None
    name = study_name_from(ws.from_)
    if name == spec.name:
        raise UserError(f"warm_start.from: {name!r} is this study itself; name an earlier study")
    try:
        source = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = sorted(s.study_name for s in storage.get_all_studies() if not is_companion(s.study_name))
        raise UserError(f"warm_start.from: no study named {name!r} in this store (studies there: {', '.join(names) or 'none'})") from None
    sampled = {p for t in source.get_trials(deepcopy=False) for p in t.params}
    if not sampled & set(spec.search_space):
        raise UserError(f"warm_start.from: study {name!r} shares no parameter with this search space "
                        f"(it sampled {', '.join(sorted(sampled)) or 'nothing'}; this one samples {', '.join(spec.search_space)})")
    if ws.import_trials:
        mine, theirs = [o.metric for o in spec.objective_list], _objectives_of(source)
        if theirs != mine or ranking.directions_of(source) != [o.direction for o in spec.objective_list]:
            raise UserError(f"warm_start.import_trials: study {name!r} optimised {', '.join(theirs) or 'unknown objectives'} "
                            f"({', '.join(ranking.directions_of(source))}); this one {', '.join(mine)}: their values would not "
                            "mean the same here. Use top_k alone (its configurations are re-run)")
        _check_constraints(source, spec)
    return source


def _fitting(t, space: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in t.params.items():
        d = space.get(k)
        if d is not None and d._contains(d.to_internal_repr(v)):
            out[k] = v
    return out


def distinct_best(trials, directions, space: dict[str, Any], k: int) -> list[tuple[Any, dict[str, Any]]]:
    """(trial, its configuration as it fits this space) of the k best trials with k different
    configurations. The same configuration can finish twice (NSGA-II's crossover can copy a parent; a
    retry re-runs one): enqueuing it twice would run it once (skip_if_exists) and leave a slot to the
    sampler unsaid."""
    best: list[tuple[Any, dict[str, Any]]] = []
    for t in ranking.ranked(trials, directions):
        if len(best) == k:
            break
        params = _fitting(t, space)
        if all(params != seen for _, seen in best):
            best.append((t, params))
    return best


def _constraint_attrs(t) -> dict[str, Any]:
    """A trial's constraints as Optuna stores them: its old list (`constraints`) and its named ones
    (`constraints:<name>`, what `trial.set_constraint` writes and the driver uses)."""
    return {k: v for k, v in t.system_attrs.items() if k == "constraints" or k.startswith("constraints:")}


def apply(study: optuna.Study, storage, spec, source: optuna.Study, lr: tuple[float, float] | None) -> str | None:
    """Enqueue / import once; a one-line summary (None when it was done before)."""
    with budget_lock(storage, spec.name):
        if study.user_attrs.get(DONE_ATTR):
            return None
        ws, space = spec.warm_start, _space(spec, lr)
        trials = source.get_trials(deepcopy=False)
        best = distinct_best(trials, ranking.directions_of(source), space, ws.top_k)
        for t, params in best:
            study.enqueue_trial(params, user_attrs={"hpolab.warm_start_from": f"{source.study_name} trial {t.number}"},
                                skip_if_exists=True)
        ranked = ranking.ranked(trials, ranking.directions_of(source)) if ws.import_trials else []
        if ranked:  # (the trial lifecycle's `imported`: marked, they count nowhere)
            lifecycle.imported(lambda: _import(study, source, ranked, space))
        imported = len(ranked)
        summary = (f"warm start from study {source.study_name}: {len(best)} best configurations enqueued "
                   f"(trials {', '.join(str(t.number) for t, _ in best) or 'none'})"
                   + (f", {imported} finished trials imported into the sampler's history" if ws.import_trials else ""))
        study.set_user_attr(DONE_ATTR, summary)
        return summary


def _import(study: optuna.Study, source: optuna.Study, trials: list, space: dict) -> None:
    """The source study's finished trials, ranked, added COMPLETE and marked imported."""
    for t in trials:
        params = _fitting(t, space)
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, values=t.values, params=params, distributions={k: space[k] for k in params},
            user_attrs={k: v for k, v in t.user_attrs.items() if k == "hpolab.objectives"},
            system_attrs={IMPORTED: f"{source.study_name} trial {t.number}", **_constraint_attrs(t)}))
