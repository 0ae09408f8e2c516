"""Which trials are best: one place for one objective and for several.

Feasible trials first, ranked among themselves -- one objective: COMPLETE trials by value (the
direction's way); several: by Pareto rank over the feasible trials only (non-dominated sorting: the
front is rank 0, the front of the rest rank 1, ...), ties by the first objective, then by the
trial's validation loss at its result epoch (`tie_break`: recorded when it completed), then the
trial number. A trial that violates a constraint (Optuna's `trial.constraints`, > 0) ranks after every
feasible one, by its total violation (then as above): an infeasible trial never pushes a feasible one
off the front, and only feasible trials are "best" -- as Optuna's own `best_trial`/`best_trials` do.

The "best" single trial of several objectives is the front's knee: the trial closest to the ideal
point (every objective at its best on the front) once each objective is scaled to the front's
range. `promote --pick` states another rule (registry/pick.py).

Whether a new value improves on the best so far (the progress line, stop_after_no_improvement) is
asked here too (`improves`). This module imports no Optuna (only numpy): `study list` and `study
status` rank the rows they read with plain SQL through it. A trial is anything with `number`,
`state` (a TrialState or its name), `values`, `system_attrs` and `constraints`.

Two readings of the same ranking live here too, so that one module decides best: the rank tags of a
study's logged trial models (`rank_tags`, `apply_rank_tags`) and the table of a study with several
objectives (`front_table`).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
from rich.table import Table

from hpolab.stores.optuna_sql import NOISE_PROBE
from hpolab.stores.trial_states import is_imported
from hpolab.study.objectives.objective_values import VALUES_ATTR


def directions_of(study) -> list[str]:
    """'maximize'/'minimize' per objective of an Optuna study."""
    return [d.name.lower() for d in study.directions]


def _names(directions: str | Sequence) -> list[str]:
    """Directions as names; Optuna's StudyDirection enum too (by its name: no Optuna import here)."""
    if isinstance(directions, str):
        return [directions]
    return [str(getattr(d, "name", d)).lower() for d in directions]


def _state(t) -> str:
    return str(getattr(t.state, "name", t.state))


def feasible(t) -> bool:
    return all(v <= 0 for v in (t.constraints or {}).values())


def violation(t) -> float:
    """How far a trial is from feasible: the sum of its positive constraint values (0: feasible)."""
    return float(sum(v for v in (t.constraints or {}).values() if v > 0))


def _complete(trials: Iterable, n: int) -> list:
    """This study's own COMPLETE trials (not those a warm start imported: history for the sampler only;
    not a noise probe's: the incumbent again on another seed, a measurement of noise, never a result)."""
    return [t for t in trials if _state(t) == "COMPLETE" and t.values is not None and len(t.values) == n
            and not is_imported(t) and not t.system_attrs.get(NOISE_PROBE)]


def improves(value: float, than: float | None, direction: str, min_delta: float = 0.0) -> bool:
    """Whether one objective's `value` beats `than` (None: nothing yet) by more than min_delta."""
    if than is None:
        return True
    return value - than > min_delta if direction == "maximize" else than - value > min_delta


def best_value(values: Iterable[float], direction: str) -> float | None:
    """The best of some values of one objective (the first of equals); None when there are none."""
    top = None
    for v in values:
        if improves(v, top, direction):
            top = v
    return top


def scores(values, direction: str) -> np.ndarray:
    """Values of one objective as scores, higher is better (a minimised one negated): what statistics
    over seeds compute on (the promotion race, the noise floor, noise-aware stopping), so that only
    this module knows which way is better. NaN stays NaN."""
    return np.asarray(values, dtype=float) * (-1.0 if _names(direction)[0] == "minimize" else 1.0)


def best_of(values, direction: str) -> np.ndarray:
    """Index of the best value along the last axis (the first of equals; NaN never best, an all-NaN
    row gives 0): the leader of a race's means, the winner of each bootstrap resample."""
    s = scores(values, direction)
    return np.argmax(np.where(np.isnan(s), -np.inf, s), axis=-1)


def within_noise(value: float, best: float, floor: float, direction: str) -> bool:
    """Whether `value` is within the noise floor of `best` (the best does not beat it by more than
    `floor`): `compare`'s tied mark."""
    return not improves(best, value, direction, floor)


def noise_band(best: float, floor: float, direction: str) -> tuple[float, float]:
    """(low, high): the values within the noise floor of `best`, on its worse side (the report's band)."""
    return (best - floor, best) if _names(direction)[0] == "maximize" else (best, best + floor)


def losses(trials: Sequence, directions: str | Sequence) -> np.ndarray:
    """Objective values as losses (maximised ones negated): lower is better in every column."""
    signs = np.array([-1.0 if d == "maximize" else 1.0 for d in _names(directions)])
    return np.array([t.values for t in trials], dtype=float).reshape(len(trials), len(signs)) * signs


def _dominated(loss: np.ndarray) -> np.ndarray:
    """Whether each row is dominated by another (<= everywhere and < somewhere)."""
    return ((loss[None, :, :] <= loss[:, None, :]).all(-1) & (loss[None, :, :] < loss[:, None, :]).any(-1)).any(1)


def pareto_ranks(loss: np.ndarray, enough: int | None = None) -> np.ndarray:
    """Non-domination rank of each row (0: on the front). With `enough`, peeling stops once that many
    rows are ranked (top_k needs no more); the rest share the next rank."""
    n = len(loss)
    ranks = np.full(n, -1)
    left = np.arange(n)
    rank = 0
    while left.size and (enough is None or n - left.size < enough):
        dominated = _dominated(loss[left])
        ranks[left[~dominated]] = rank
        left = left[dominated]
        rank += 1
    ranks[left] = rank
    return ranks


def ranked(trials: Iterable, directions: str | Sequence, enough: int | None = None) -> list:
    """COMPLETE trials, best first (module docstring); `enough`: only the first that many need be exact."""
    names = _names(directions)
    done = _complete(trials, len(names))
    ok = [t for t in done if feasible(t)]
    out = []
    if ok:  # the feasible ones, ranked among themselves only (an infeasible trial dominates nobody)
        loss = losses(ok, names)
        rank = pareto_ranks(loss, enough) if len(names) > 1 else np.zeros(len(ok))
        out = [ok[i] for i in sorted(range(len(ok)), key=lambda i: (rank[i], loss[i, 0], _tie(ok[i]), ok[i].number))]
    if enough is not None and len(out) >= enough:
        return out
    bad = [t for t in done if not feasible(t)]
    if bad:  # then the infeasible ones, the nearest to feasible first
        loss = losses(bad, names)
        out += [bad[i] for i in sorted(range(len(bad)), key=lambda i: (violation(bad[i]), loss[i, 0], bad[i].number))]
    return out


TIE_ATTR = "hpolab.tie_break"  # system attr of a COMPLETE trial: {"metric", "value"}, its loss at its result epoch
LOSS_NAMES = ("val_loss", "eval_loss", "valid_loss", "validation_loss", "loss", "test_loss")


def tie_break(metric: str, metrics: dict[str, float]) -> dict | None:
    """What breaks a tie on the study metric for a trial whose result epoch reported `metrics`: its
    validation loss (lower is better: a loss's direction is known), the one named like the study
    metric first (eval_accuracy -> eval_loss); None when the study metric is itself a loss or no
    loss was reported (then the trial number decides, as before)."""
    if "loss" in metric:
        return None
    prefix = metric.split("_", 1)[0]
    for name in (f"{prefix}_loss", *LOSS_NAMES):
        value = metrics.get(name)
        if isinstance(value, (int, float)) and value == value:
            return {"metric": name, "value": float(value)}
    return None


def tie_value(t) -> float | None:
    """The loss that breaks a tie for trial `t` (None: it recorded none)."""
    tie = (t.system_attrs or {}).get(TIE_ATTR)
    return float(tie["value"]) if isinstance(tie, dict) and isinstance(tie.get("value"), (int, float)) else None


def _tie(t) -> float:
    value = tie_value(t)
    return float("inf") if value is None else value


def tie_note(trials: Iterable, directions: str | Sequence) -> str | None:
    """One objective: the line saying a tie for the best value was broken by the loss (None: no tie)."""
    names = _names(directions)
    top = [t for t in ranked(trials, names, enough=2)[:2] if feasible(t)]
    if len(names) > 1 or len(top) < 2 or top[0].values[0] != top[1].values[0]:
        return None
    a, b = ((t.system_attrs or {}).get(TIE_ATTR) for t in top)
    if not (isinstance(a, dict) and isinstance(b, dict) and a.get("metric") == b.get("metric")) or a["value"] == b["value"]:
        return f"trials {top[0].number} and {top[1].number} tie at {top[0].values[0]:.4g}; the lower trial number is first"
    return (f"trials {top[0].number} and {top[1].number} tie at {top[0].values[0]:.4g}; the lower {a['metric']} "
            f"({a['value']:.6g} vs {b['value']:.6g}) puts trial {top[0].number} first")


def top_k(trials: Iterable, k: int, directions: str | Sequence) -> list[int]:
    """Numbers of the k best COMPLETE trials."""
    return [t.number for t in ranked(trials, directions, enough=k)[:k]]


def front(trials: Iterable, directions: str | Sequence) -> list:
    """The feasible COMPLETE trials no other feasible one dominates (by trial number)."""
    names = _names(directions)
    done = [t for t in _complete(trials, len(names)) if feasible(t)]
    if not done:
        return []
    loss = losses(done, names)
    # In lexicographic order every dominator of a point comes before it, and a dominated dominator is
    # itself dominated by one already kept: checking against the kept ones is enough (O(n x front)
    # memory and time, where a full pairwise matrix of thousands of trials would take gigabytes).
    kept: list[int] = []
    for i in np.lexsort(loss.T[::-1]):
        if kept:
            k = loss[kept]
            if ((k <= loss[i]).all(1) & (k < loss[i]).any(1)).any():
                continue
        kept.append(int(i))
    return sorted((done[i] for i in kept), key=lambda t: t.number)


def front_marks(trials: Sequence, directions: str | Sequence) -> dict[int, str]:
    """Trial number -> "knee" or "yes" for the trials on the feasible front (the tables' `front` column)."""
    on_front = front(trials, directions)
    k = knee(on_front, directions)
    return {t.number: "knee" if k is not None and t.number == k.number else "yes" for t in on_front}


def primary_direction(study, metric: str) -> str:
    """The direction of the study metric (several objectives: of the one pruned on, named `metric`)."""
    directions = directions_of(study)
    names = study.metric_names or []
    return directions[names.index(metric)] if metric in names else directions[0]


def _scaled(loss: np.ndarray) -> np.ndarray:
    """Each column of losses to [0, 1] over its range (0: the best). An infinite value has no range
    to scale by: an infinitely good one (-inf loss) is 0 and every finite value of its column 1 (as
    far as the range goes); an infinitely bad one is 1, the finite ones scaled among themselves."""
    out = np.ones_like(loss)
    for j in range(loss.shape[1]):
        col = loss[:, j]
        if np.isneginf(col).any():
            out[:, j] = np.where(np.isneginf(col), 0.0, 1.0)
            continue
        finite = col[np.isfinite(col)]
        if finite.size:
            low, span = finite.min(), np.ptp(finite)
            out[np.isfinite(col), j] = (finite - low) / (span if span > 0 else 1.0)
    return out


def knee(on_front: Sequence, directions: str | Sequence):
    """The front's trial nearest the ideal point, each objective scaled to the front's range."""
    if not on_front:
        return None
    loss = losses(on_front, directions)
    scaled = _scaled(loss)
    distance = np.sqrt((scaled ** 2).sum(1)).round(12)
    # ties (a two-trial front is one): the better first objective, then the earlier trial -- whatever the order given
    i = min(range(len(on_front)), key=lambda i: (distance[i], loss[i, 0], on_front[i].number))
    return on_front[i]


def best(trials: Iterable, directions: str | Sequence):
    """The best feasible COMPLETE trial: by value for one objective, the knee for several."""
    names = _names(directions)
    if len(names) > 1:
        return knee(front(trials, names), names)
    top = ranked(trials, names)
    return top[0] if top and feasible(top[0]) else None


def hypervolume(on_front: Sequence, directions: str | Sequence, reference: np.ndarray) -> float:
    """The objective-space volume the front dominates up to `reference` (losses, as losses() gives)."""
    from optuna._hypervolume import compute_hypervolume

    if not on_front:
        return 0.0
    loss = losses(on_front, directions)
    inside = loss[(loss < reference).all(1)]
    return float(compute_hypervolume(inside, reference)) if len(inside) else 0.0


def hypervolume_history(trials: Sequence, directions: str | Sequence) -> list[tuple[int, float]]:
    """(trial number, hypervolume of the feasible front so far) after each COMPLETE trial; the
    reference point is the worst value of each objective over all of them, pushed 10% out."""
    names = _names(directions)
    done = [t for t in _complete(trials, len(names)) if feasible(t)]
    if not done:
        return []
    loss = losses(done, names)
    worst, span = loss.max(0), np.ptp(loss, 0)
    reference = worst + 0.1 * np.where(span > 0, span, np.abs(worst) + 1.0)
    out, current = [], []
    for t in sorted(done, key=lambda t: t.number):  # the front so far, grown one trial at a time
        current = front(current + [t], names)
        out.append((t.number, hypervolume(current, names, reference)))
    return out


# The rank tags of a study's logged trial models, as the trials rank above: one objective,
# `hpolab.rank` (1 = best); several, `hpolab.pareto_rank` (0 = the feasible front, "infeasible" for a
# trial that violates a constraint) and `hpolab.on_front`. A trial that is not COMPLETE (a PRUNED
# one's model under `log_models: all`) has none. Ranks change as trials finish: retention's passes
# (during the study and at its end) rewrite the tags of the models still kept, one write per model
# and only where a value changed.
RANK, PARETO_RANK, ON_FRONT = "hpolab.rank", "hpolab.pareto_rank", "hpolab.on_front"


def rank_tags(trials: Iterable, directions: str | Sequence) -> dict[int, dict[str, str | None]]:
    """Trial number -> the rank tags its model should carry (None: the tag should not be there)."""
    trials = list(trials)
    names = [directions] if isinstance(directions, str) else list(directions)
    order = ranked(trials, names)
    empty = {RANK: None, PARETO_RANK: None, ON_FRONT: None}
    out: dict[int, dict[str, str | None]] = {t.number: dict(empty) for t in trials}
    if len(names) == 1:
        for i, t in enumerate(order):
            out[t.number][RANK] = str(i + 1)
        return out
    ok = [t for t in order if feasible(t)]
    ranks = pareto_ranks(losses(ok, names)) if ok else []
    for t, r in zip(ok, ranks):  # rank 0 among the feasible trials is the front
        out[t.number].update({PARETO_RANK: str(int(r)), ON_FRONT: str(int(r) == 0).lower()})
    for t in order:
        if not feasible(t):
            out[t.number].update({PARETO_RANK: "infeasible", ON_FRONT: "false"})
    return out


def apply_rank_tags(client, experiment_id: str, study: str, tags: dict[int, dict[str, str | None]]) -> int:
    """Rewrite the rank tags of the study's live trial models where they differ; how many changed."""
    from mlflow.exceptions import MlflowException

    from hpolab.stores.model_links import set_changed_tags, study_models, trial_model_of

    changed = 0
    for model in study_models(client, experiment_id):
        number = trial_model_of(model, study)
        if number is None or number not in tags:
            continue
        try:
            changed += set_changed_tags(client, model, tags[number])
        except MlflowException:  # another worker's retention deleted it since the search: nothing to tag
            if _live(client, model.model_id):
                raise
    return changed


def _live(client, model_id: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_logged_model(model_id).status is not None
    except MlflowException:
        return False


# The table of a study with several objectives: its COMPLETE trials best-first, each objective's
# value (a PRUNED trial's as measured), whether it is on the front, feasibility -- what the driver
# prints at the end and `study status` shows.
def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def front_table(study, name: str, title_extra: str = "", limit: int | None = None) -> Table:
    names = study.metric_names or [f"objective {i}" for i in range(len(study.directions))]
    directions = directions_of(study)
    trials = study.get_trials(deepcopy=False)
    best_first = ranked(trials, directions)
    marks = front_marks(trials, directions)
    table = Table(title=f"study {name} ({', '.join(f'{n} {d}' for n, d in zip(names, directions))})"
                  + (f": {title_extra}" if title_extra else ""))
    bounded = sorted({m for t in trials for m in (t.user_attrs.get(VALUES_ATTR) or {})} - set(names))  # constraints' own metrics
    for col in ("trial", "state", *names, *bounded, "front", "feasible"):
        table.add_column(col, justify="left" if col in ("state", "front", "feasible") else "right")
    shown = best_first + [t for t in trials if t.state.name in ("PRUNED", "FAIL", "RUNNING")]
    for t in shown[:limit] if limit else shown:
        recorded = t.user_attrs.get(VALUES_ATTR) or {}
        values = list(t.values) if t.values is not None and len(t.values) == len(names) else [recorded.get(n) for n in names]
        ok = "" if not t.constraints else ("yes" if feasible(t) else "no")
        table.add_row(str(t.number), t.state.name, *[_fmt(v) for v in values], *[_fmt(recorded.get(m)) for m in bounded],
                      marks.get(t.number, ""), ok)
    return table
