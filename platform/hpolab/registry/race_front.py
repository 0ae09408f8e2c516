"""A promotion race of several objectives: the winner is what the pick rule (`--pick`, else the knee)
takes from the front of the candidates' means over seeds, and P(best) is how often the same rule
takes each candidate when the seeds are resampled (paired, as race_stats.py does for one objective).
Nobody is dropped between rounds: every candidate runs every seed.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from hpolab.registry.race_stats import BOOTSTRAP_SEED
from hpolab.study.objectives.objective_values import VALUES_ATTR

RESAMPLES = 400  # bootstrap resamples (each one is a front and a pick: dearer than one objective's)


def _as_trials(means: dict[str, dict[str, float]], names: list[str]) -> list:
    """The candidates' means as trials ranking.py and pick.py read (number = position)."""
    return [SimpleNamespace(number=i, state="COMPLETE", values=[m[n] for n in names], constraints={}, system_attrs={},
                            user_attrs={VALUES_ATTR: dict(m)}) for i, m in enumerate(means.values())]


def _chosen(means: dict[str, dict[str, float]], names: list[str], directions: list[str], rule) -> str | None:
    from hpolab.registry.pick import choose
    from hpolab.study.objectives import ranking

    labels = list(means)
    trials = _as_trials(means, names)
    picked = choose(ranking.front(trials, directions), names, rule, directions)
    return None if picked is None else labels[picked.number]


def front_winner(result, info, pick: str | None) -> tuple[str | None, str]:
    """(the winner, why) from the means of the candidates that ran every seed; fills each one's P(best)."""
    from hpolab.registry.pick import rule_for

    names, directions = list(info.objectives), result.directions
    labels = [c for c, s in result.standings.items() if s.racing and s.values]
    if not labels:
        return None, ""
    per = {c: result.objectives[c] for c in labels}
    seeds = sorted(set.intersection(*(set(per[c][names[0]]) for c in labels)))
    means = {c: {m: float(np.mean([per[c][m][s] for s in seeds])) for m in per[c]} for c in labels}
    rule = rule_for(_as_trials(means, names), names, pick)
    winner = _chosen(means, names, directions, rule)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    wins = dict.fromkeys(labels, 0)
    for _ in range(RESAMPLES):
        drawn = rng.choice(seeds, size=len(seeds))
        m = {c: {k: float(np.mean([per[c][k][s] for s in drawn])) for k in per[c]} for c in labels}
        w = _chosen(m, names, directions, rule)
        if w is not None:
            wins[w] += 1
    for c in labels:
        result.standings[c].p_best = wins[c] / RESAMPLES
    how = f"--pick {rule.describe()}" if pick else "the knee of the front of the means (no --pick)"
    return winner, f"{how} over {len(seeds)} seeds: {winner}"
