"""A promotion race's statistics as pure functions: each candidate's value per seed in; who is
dropped, each candidate's mean, 95% interval and P(best), the winner and the noise floor out.

No stores, no models. Which way is better is ranking.py's (`scores`: higher is better; `best_of`);
here only statistics over seeds happen.

Rounds. Every candidate trains on the same seeds (paired: seed s is one draw of initial weights,
data order, dropout and augmentation for each of them). Round 1 trains the first FIRST_ROUND seeds (a
paired test needs a spread to test with), each later round one more seed, up to the race's seed
budget. After each round the leader is the candidate still racing with the best mean; every other
candidate still racing is dropped when its paired difference to the leader is significant:

    a one-sided paired t-test on the seeds both ran, H0 "no worse than the leader", at level ALPHA = 0.05.

(A difference with no spread at all, the same gap on every seed, counts as significant when it is
not zero.) The test is repeated after every round without a correction for it, as irace's races do:
the race is a filter in front of the held-out gate, which still decides. Several objectives have no
drops (which front member is "significantly worse" has no single answer): every candidate runs every
seed and the pick rule decides on the means (race.py).

Reported per candidate: the mean over its seeds, a Student-t 95% confidence interval of the mean
(n >= 2), and P(best): the share of BOOTSTRAP resamples of the race's seeds (drawn with replacement,
the same draw for every candidate: paired) in which its mean over the drawn seeds it ran is the best
(a fixed RNG seed, so a re-run prints the same numbers). The winner is the best mean among the
candidates not dropped. The noise floor is the pooled standard deviation over seeds within each
candidate: how far one configuration's metric moves with the training seed alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hpolab.study.objectives.noise import pooled_sd
from hpolab.study.objectives.ranking import best_of, scores

ALPHA = 0.05  # one-sided level of the paired test that drops a candidate
FIRST_ROUND = 3  # seeds in the first round (a paired t-test needs at least 2; 3 gives it a spread worth testing)
BOOTSTRAP = 2000  # resamples for P(best)
BOOTSTRAP_SEED = 0  # fixed: the same results always print the same P(best)


def round_seeds(seeds: list[int], rnd: int) -> list[int]:
    """The seeds trained up to and including round `rnd` (1-based)."""
    return seeds[: min(len(seeds), FIRST_ROUND + rnd - 1)]


def rounds_of(n_seeds: int) -> int:
    """How many rounds a seed budget of `n_seeds` allows."""
    return 1 + max(0, n_seeds - FIRST_ROUND)


def paired_p(leader: np.ndarray, other: np.ndarray) -> float:
    """One-sided p of "other is no worse than leader" from paired scores (higher is better)."""
    from scipy.stats import t as student_t

    d = leader - other
    n = len(d)
    if n < 2:
        return 1.0
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        return 0.0 if mean > 0 else 1.0
    return float(student_t.sf(mean / (sd / math.sqrt(n)), n - 1))


def drops_after(results: dict[str, dict[int, float]], racing: list[str], seeds: list[int], direction: str) -> dict[str, float]:
    """The candidates of `racing` to drop after a round on `seeds`, with each one's p against the leader."""
    rows = np.array([[results[c][s] for s in seeds] for c in racing], dtype=float)
    s = scores(rows, direction)
    lead = int(best_of(rows.mean(1), direction))
    out = {}
    for i, c in enumerate(racing):
        if i != lead:
            p = paired_p(s[lead], s[i])
            if p < ALPHA:
                out[c] = p
    return out


def ci95(values: list[float]) -> tuple[float, float]:
    """Student-t 95% interval of the mean; (nan, nan) from fewer than two values."""
    from scipy.stats import t as student_t

    n = len(values)
    if n < 2:
        return math.nan, math.nan
    mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
    half = float(student_t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def p_best(results: dict[str, dict[int, float]], direction: str, seeds: list[int]) -> dict[str, float]:
    """P(best) of each candidate by the paired bootstrap over `seeds` (module docstring)."""
    names = list(results)
    table = np.array([[results[c].get(s, math.nan) for s in seeds] for c in names], dtype=float)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    draws = rng.integers(0, len(seeds), size=(BOOTSTRAP, len(seeds)))
    picked = table[:, draws]  # (candidates, resamples, seeds)
    ran = ~np.isnan(picked)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(ran, picked, 0.0).sum(-1) / ran.sum(-1)  # NaN where a candidate ran none of the drawn seeds
    wins = np.bincount(best_of(means.T, direction), minlength=len(names))
    return {c: float(wins[i]) / BOOTSTRAP for i, c in enumerate(names)}


def noise_floor(results: dict[str, dict[int, float]]) -> tuple[float | None, int]:
    """(the pooled standard deviation over seeds within each candidate, its degrees of freedom);
    (None, 0) without two seeds of one candidate."""
    return pooled_sd(per_seed.values() for per_seed in results.values())


@dataclass
class Standing:
    """One candidate in a race: its results and, once dropped, when and why."""

    label: str
    values: dict[int, float] = field(default_factory=dict)  # seed -> the metric on val
    dropped_after: int | None = None  # the round it was dropped after
    p_value: float | None = None  # its paired test's p when dropped
    failed: str | None = None  # why it left the race without a result (a seed trial that failed for good)
    mean: float = math.nan
    ci: tuple[float, float] = (math.nan, math.nan)
    p_best: float = 0.0

    @property
    def racing(self) -> bool:
        return self.dropped_after is None and self.failed is None


def summarise(standings: dict[str, Standing], direction: str, seeds: list[int]) -> str | None:
    """Fill each candidate's mean, interval and P(best); the winner's label (None: no candidate left)."""
    results = {c: s.values for c, s in standings.items() if s.values}
    for c, s in standings.items():
        vals = [s.values[k] for k in seeds if k in s.values]
        s.mean = float(np.mean(vals)) if vals else math.nan
        s.ci = ci95(vals)
    if results:
        for c, p in p_best(results, direction, seeds).items():
            standings[c].p_best = p
    left = [c for c, s in standings.items() if s.racing and s.values]
    if not left:
        return None
    return left[int(best_of(np.array([standings[c].mean for c in left]), direction))]
