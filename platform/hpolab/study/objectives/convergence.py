"""`stop_when_converged`: stop a study once an unseen configuration is unlikely to beat its best by
more than the noise floor.

The estimate. The latest `window` results (COMPLETE feasible trials in the order they finished, a
noise probe's aside) stand for what the sampler proposes now. Their spread s is the spread of the
configurations it draws plus the seed noise of every measurement; the noise floor sigma is that seed
noise, measured (noise.py: a promotion race's, or the study's noise probe's). So the configurations
themselves spread by tau = sqrt(max(s^2 - sigma^2, 0)) around their mean mu, and the chance that an
unseen one is truly better than the incumbent's value b by more than sigma is

    P = 1 - Phi((b + sigma - mu) / tau)          (on scores: higher is better, ranking.scores)

(tau = 0: 0). The study starts no new trial once P < threshold, after min_trials results; running
trials finish. Optuna's Terminator (deprecated in 4.9 and moved out of core) bounds the regret with a
Gaussian process and compares it with the spread of cross-validation folds, and Ray's
ExperimentPlateauStopper compares the top results' spread with a fixed std; here the noise is the
one measured on this study's own configuration over training seeds: the spread inside which a further
"improvement" is seed luck.

Without a measured noise floor the study does not stop on this rule (it says so once). One objective
only (the spec refuses it with several: config/objectives.py).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from hpolab.study.objectives.noise import noise_floor
from hpolab.study.objectives.ranking import best_value, scores


def chance_to_beat(values: list[float], best: float, floor: float, direction: str) -> float:
    """P that a configuration drawn like `values` is truly better than `best` by more than `floor`."""
    s = scores(values, direction)
    if len(s) < 2:
        return 1.0
    b = float(scores([best], direction)[0])
    tau2 = max(float(np.var(s, ddof=1)) - floor ** 2, 0.0)
    if tau2 == 0.0:
        return 0.0
    z = (b + floor - float(s.mean())) / math.sqrt(tau2)
    return 0.5 * math.erfc(z / math.sqrt(2))


class Convergence:
    """Asked by the study's stop rules (stopping.py) with the results in finishing order."""

    def __init__(self, rule, direction: str, metric: str, note: Callable[[str], None]):
        self.rule, self.direction, self.metric, self.note = rule, direction, metric, note
        self._said = False

    def reason(self, values: list[float | None], start: int, user_attrs) -> str | None:
        """Why to stop now, or None. `values`: results in finishing order (None: pruned or infeasible);
        those before `start` (an earlier stop's) set the best but are not in the window."""
        done = [v for v in values if v is not None]
        if len(done) < self.rule.min_trials:
            return None
        window = [v for v in values[start:] if v is not None][-self.rule.window:]
        if len(window) < min(self.rule.window, self.rule.min_trials):
            return None
        floor = noise_floor(user_attrs)
        if floor is None:
            if not self._said:
                self._said = True
                self.note("stop_when_converged: no noise floor measured yet (add noise_probe:, or race with hpolab promote); "
                          "the study goes on")
            return None
        best = best_value(done, self.direction)
        p = chance_to_beat(window, best, floor, self.direction)
        if p >= self.rule.threshold:
            return None
        return (f"stop_when_converged: P(an unseen configuration beats the best {self.metric} {best:.6g} by more than the "
                f"noise floor {floor:.3g}) = {p:.3g} < {self.rule.threshold:g}, estimated from the latest {len(window)} results")
