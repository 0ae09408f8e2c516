"""A study that ends on its epoch budget ended as planned: `study run` exits 0 and says the budget is
spent, also when no trial reached the top rung (then it names the best trial at the highest rung
reached); the run_study API returns the Study instead of raising."""

from __future__ import annotations

import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from conftest import assert_study_check_clean, open_study, run_cli
from hpolab.api.running import study_exit
from hpolab.errors import EXIT_OK
from hpolab.study.driver.driver import Outcome
from hpolab.study.objectives.trial_scheduler import best_at_highest_rung
from hpolab.stores.trial_states import PAUSED as PAUSED_ATTR


def _paused(number: int, values: dict[int, float], rung: int, state=TrialState.PRUNED):
    t = create_trial(state=state, params={"lr": 0.1}, distributions={"lr": FloatDistribution(0.01, 1.0)},
                     intermediate_values=values, system_attrs={PAUSED_ATTR: {"rung": rung, "epoch": max(values)}})
    t.number = number
    return t


def test_a_budget_end_without_a_complete_trial_exits_0_and_says_why():
    outcome = Outcome(counts={"finished": 3, "complete": 0, "pruned": 3, "fail": 0}, n_trials=8, budget_spent=True)
    code, message = study_exit(outcome)
    assert code == EXIT_OK and message is None
    not_spent = Outcome(counts={"finished": 3, "complete": 0, "pruned": 3, "fail": 0}, n_trials=8)
    assert study_exit(not_spent)[0] != EXIT_OK  # a study whose trials all died is still a failure


def test_the_best_at_the_highest_rung_reached_is_named():
    trials = [_paused(0, {1: 0.5}, 0), _paused(1, {1: 0.7, 2: 0.8}, 1), _paused(2, {1: 0.9, 2: 0.85}, 1), _paused(3, {1: 0.95}, 0)]
    t, epoch = best_at_highest_rung(trials, "maximize")
    assert (t.number, epoch) == (2, 2)  # rung 1 beats a better value at rung 0
    t, epoch = best_at_highest_rung(trials, "minimize")
    assert (t.number, epoch) == (1, 2)
    assert best_at_highest_rung([], "maximize") is None


@pytest.mark.slow
def test_a_study_ended_by_its_epoch_budget_before_the_top_rung_exits_0(store):
    out = run_cli("--store", str(store), "study", "run", "studies/digits_asha.yaml", "name=asha-spent", "n_trials=6",
                  "parallel=1", "budget.epochs=3", check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "the epoch budget is spent: 3 / 3 (budget.epochs)" in out.stdout, out.stdout
    _, study = open_study(store, "asha-spent")
    rung_best = max((t for t in study.get_trials() if len(t.intermediate_values) == 2), key=lambda t: t.intermediate_values[2])
    assert f"no trial reached the top rung (epoch 4); the best at rung 1 (epoch 2): trial {rung_best.number}" in out.stdout, out.stdout
    assert_study_check_clean(store, "asha-spent")
