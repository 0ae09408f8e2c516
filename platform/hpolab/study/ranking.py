"""Which trials are best: one place for one objective and for several.

One objective: COMPLETE trials by value (the direction's way), ties to the earlier trial.
Several: by Pareto rank (non-dominated sorting: the front is rank 0, the front of the rest rank 1,
...), ties by the first objective, then the trial number. Either way, a trial that violates a
constraint (Optuna's `trial.constraints`, > 0) ranks after every feasible one, and only feasible
trials make the front -- as Optuna's own `best_trial`/`best_trials` do.

The "best" single trial of several objectives is the front's knee: the trial closest to the ideal
point (every objective at its best on the front) once each objective is scaled to the front's
range. `promote --pick` states another rule (registry/pick.py).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from hpolab.study.budget import IMPORTED


def directions_of(study) -> list[str]:
    """'maximize'/'minimize' per objective of an Optuna study."""
    return [d.name.lower() for d in study.directions]


def _names(directions: str | Sequence) -> list[str]:
    if isinstance(directions, str):
        return [directions]
    return [d.name.lower() if isinstance(d, StudyDirection) else str(d) for d in directions]


def feasible(t: FrozenTrial) -> bool:
    return all(v <= 0 for v in (t.constraints or {}).values())


def _complete(trials: Iterable[FrozenTrial], n: int) -> list[FrozenTrial]:
    """This study's own COMPLETE trials (not those a warm start imported: history for the sampler only)."""
    return [t for t in trials if t.state == TrialState.COMPLETE and t.values is not None and len(t.values) == n
            and not t.system_attrs.get(IMPORTED)]


def losses(trials: Sequence[FrozenTrial], directions: str | Sequence) -> np.ndarray:
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


def ranked(trials: Iterable[FrozenTrial], directions: str | Sequence, enough: int | None = None) -> list[FrozenTrial]:
    """COMPLETE trials, best first (module docstring); `enough`: only the first that many need be exact."""
    names = _names(directions)
    done = _complete(trials, len(names))
    if not done:
        return []
    loss = losses(done, names)
    rank = pareto_ranks(loss, enough) if len(names) > 1 else np.zeros(len(done))
    order = sorted(range(len(done)), key=lambda i: (not feasible(done[i]), rank[i], loss[i, 0], done[i].number))
    return [done[i] for i in order]


def top_k(trials: Iterable[FrozenTrial], k: int, directions: str | Sequence) -> list[int]:
    """Numbers of the k best COMPLETE trials."""
    return [t.number for t in ranked(trials, directions, enough=k)[:k]]


def front(trials: Iterable[FrozenTrial], directions: str | Sequence) -> list[FrozenTrial]:
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


def front_marks(trials: Sequence[FrozenTrial], directions: str | Sequence) -> dict[int, str]:
    """Trial number -> "knee" or "yes" for the trials on the feasible front (the tables' `front` column)."""
    on_front = front(trials, directions)
    k = knee(on_front, directions)
    return {t.number: "knee" if k is not None and t.number == k.number else "yes" for t in on_front}


def primary_direction(study, metric: str) -> str:
    """The direction of the study metric (several objectives: of the one pruned on, named `metric`)."""
    directions = directions_of(study)
    names = study.metric_names or []
    return directions[names.index(metric)] if metric in names else directions[0]


def knee(on_front: Sequence[FrozenTrial], directions: str | Sequence) -> FrozenTrial | None:
    """The front's trial nearest the ideal point, each objective scaled to the front's range."""
    if not on_front:
        return None
    loss = losses(on_front, directions)
    low, span = loss.min(0), np.ptp(loss, 0)
    scaled = (loss - low) / np.where(span > 0, span, 1.0)
    distance = np.sqrt((scaled ** 2).sum(1)).round(12)
    # ties (a two-trial front is one): the better first objective, then the earlier trial -- whatever the order given
    i = min(range(len(on_front)), key=lambda i: (distance[i], loss[i, 0], on_front[i].number))
    return on_front[i]


def best(trials: Iterable[FrozenTrial], directions: str | Sequence) -> FrozenTrial | None:
    """The best feasible COMPLETE trial: by value for one objective, the knee for several."""
    names = _names(directions)
    if len(names) > 1:
        return knee(front(trials, names), names)
    top = ranked(trials, names)
    return top[0] if top and feasible(top[0]) else None


def hypervolume(on_front: Sequence[FrozenTrial], directions: str | Sequence, reference: np.ndarray) -> float:
    """The objective-space volume the front dominates up to `reference` (losses, as losses() gives)."""
    from optuna._hypervolume import compute_hypervolume

    if not on_front:
        return 0.0
    loss = losses(on_front, directions)
    inside = loss[(loss < reference).all(1)]
    return float(compute_hypervolume(inside, reference)) if len(inside) else 0.0


def hypervolume_history(trials: Sequence[FrozenTrial], directions: str | Sequence) -> list[tuple[int, float]]:
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
