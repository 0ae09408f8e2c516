"""`stop_after_no_improvement` (and `stop_when_converged`, convergence.py): stop a study that has stopped getting better.

Counted are the study's finished trials that produced a result, COMPLETE and PRUNED, in the order
they finished (FAIL trials are neither an improvement nor a miss: failures are their own matter).
A COMPLETE feasible trial improves when its value beats the best feasible value before it by more
than `min_delta`; a PRUNED or infeasible one (a constraint violated) never does, and sets no best
(ranking.py decides what beats what). With several objectives a trial improves when it joins the feasible
Pareto front (no earlier trial on it is at least as good in every objective; min_delta must be 0). Once `trials` of them in a row did not improve, the study starts no new
trial; running ones finish. The reason is recorded once: tag `hpolab.stop_reason` on the parent
run, Optuna study user attr `hpolab.stop` ({reason, n_trials, results}).

A re-run of a stopped study says so and runs nothing (exit 0), unless n_trials was raised above
the budget it stopped at: then the count starts again from the trials after the stop (the best
value so far still counts). Removing `stop_after_no_improvement` from the spec also lets it go on.
"""

from __future__ import annotations

from typing import Callable

import optuna
from optuna.trial import TrialState

from hpolab.config.spec import StudySpec
from hpolab.stores.optuna_sql import NOISE_PROBE
from hpolab.stores.trial_states import is_imported
from hpolab.study.objectives.convergence import Convergence
from hpolab.study.objectives.noise import noise_floor
from hpolab.study.objectives.ranking import feasible, front, improves, losses
from hpolab.stores import mlflow_runs as tr


def no_improvement_streak(values: list[float | None], maximize: bool, min_delta: float, start: int = 0) -> tuple[int, int | None]:
    """(trials in a row without an improvement at the end of `values`, index of the best value).

    `values`: results in finishing order, None for a pruned or infeasible trial (one_objective_results).
    Results before `start` set the best value but are not counted in the streak.
    """
    direction = "maximize" if maximize else "minimize"
    best: float | None = None
    best_at: int | None = None
    streak = 0
    for i, v in enumerate(values):
        improved = v is not None and improves(v, best, direction, min_delta)
        if v is not None and improves(v, best, direction):
            best, best_at = v, i
        if improved:
            streak = 0
        elif i >= start:
            streak += 1
    return streak, best_at


def front_streak(trials: list[optuna.trial.FrozenTrial], directions: list[str], start: int = 0) -> tuple[int, list]:
    """Several objectives: (trials in a row at the end of `trials` that did not join the Pareto front,
    the front after all of them). A COMPLETE feasible trial improves when no trial on the front
    before it is at least as good in every objective (an equal point brings nothing); a PRUNED or
    infeasible one never does. Trials before `start` shape the front but are not counted."""
    current: list = []
    streak = 0
    for i, t in enumerate(trials):
        ok = t.state == TrialState.COMPLETE and t.values is not None and feasible(t)
        improved = ok and not (current and (losses(current, directions) <= losses([t], directions)).all(1).any())
        if improved:
            current = front(current + [t], directions)
            streak = 0
        elif i >= start:
            streak += 1
    return streak, current


def one_objective_results(trials: list[optuna.trial.FrozenTrial]) -> list[float | None]:
    """What no_improvement_streak reads: a COMPLETE feasible trial's value, else None (a miss)."""
    return [t.value if t.state == TrialState.COMPLETE and feasible(t) else None for t in trials]


def results_in_order(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The COMPLETE and PRUNED trials, in the order they finished."""
    done = [t for t in study.get_trials(deepcopy=False)
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and not is_imported(t)  # (warm start's: not results here)
            and not t.system_attrs.get(NOISE_PROBE)]  # (a noise probe's: a measurement of noise, not a result)
    return sorted(done, key=lambda t: (t.datetime_complete is None, t.datetime_complete, t.number))


def min_delta_of(rule, user_attrs) -> float:
    """The rule's min_delta; `noise`: the study's measured noise floor (noise.py), 0 until one is measured."""
    if rule.min_delta != "noise":
        return float(rule.min_delta)
    return noise_floor(user_attrs) or 0.0


class NoImprovementStop:
    """The study's stop rules (`stop_after_no_improvement`, `stop_when_converged`: convergence.py): the
    driver asks `should_stop()` before starting trials; it records and prints the reason once."""

    def __init__(self, spec: StudySpec, study: optuna.Study, client, parent_run_id: str, note: Callable[[str], None]):
        self.spec, self.study, self.client, self.parent_run_id, self.note = spec, study, client, parent_run_id, note
        self.reason: str | None = None
        self.converged = (Convergence(spec.stop_when_converged, spec.direction, spec.metric, note)
                          if spec.stop_when_converged is not None else None)

    def should_stop(self) -> bool:
        rule = self.spec.stop_after_no_improvement
        if self.reason is not None or (rule is None and self.converged is None):
            return self.reason is not None
        record = self.study.user_attrs.get("hpolab.stop")
        if record and self.spec.n_trials <= record["n_trials"]:
            self.reason = record["reason"]
            self.note(f"study {self.spec.name} stopped earlier: {self.reason}. "
                      f"Raise n_trials above {record['n_trials']} to continue it.")
            tr.set_tags(self.client, self.parent_run_id, {"hpolab.stop_reason": self.reason})
            return True
        trials = results_in_order(self.study)
        start = record["results"] if record else 0
        self.reason = (self._no_improvement(rule, trials, start) if rule is not None else None) or (
            self.converged.reason(one_objective_results(trials), start, self.study.user_attrs) if self.converged else None)
        if self.reason is None:
            return False
        self.study.set_user_attr("hpolab.stop", {"reason": self.reason, "n_trials": self.spec.n_trials, "results": len(trials)})
        tr.set_tags(self.client, self.parent_run_id, {"hpolab.stop_reason": self.reason})
        self.note(f"{self.reason}: starting no new trials; running ones finish")
        return True

    def _no_improvement(self, rule, trials: list, start: int) -> str | None:
        if self.spec.is_multi_objective:
            streak, on_front = front_streak(trials, [o.direction for o in self.spec.objective_list], start)
            if streak < rule.trials:
                return None
            held = f"the front: trials {', '.join(str(t.number) for t in on_front)}" if on_front else "no feasible trial yet"
            return f"stop_after_no_improvement: {streak} finished trials in a row did not join the Pareto front ({held})"
        delta = min_delta_of(rule, self.study.user_attrs)
        streak, best_at = no_improvement_streak(one_objective_results(trials), self.spec.direction == "maximize", delta, start)
        if streak < rule.trials:
            return None
        best = trials[best_at] if best_at is not None else None
        since = f"the best {self.spec.metric} {best.value:.6g} (trial {best.number})" if best else "any result"
        return (f"stop_after_no_improvement: {streak} finished trials in a row brought no improvement "
                f"larger than {delta:g}{' (the noise floor)' if rule.min_delta == 'noise' else ''} over {since}")
