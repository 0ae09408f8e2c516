"""budget.epochs under a trial scheduler with parallel > 1: a segment already training will train
to its rung, so its epochs are counted before another segment is started or promoted (without this,
two slots spent the budget's last epochs twice: 8 of 6 epochs at parallel 2)."""

from __future__ import annotations

import re

import optuna
import pytest
from optuna.trial import TrialState

from conftest import open_study, run_cli
from hpolab.study.driver.pauses import epochs_in_flight
from hpolab.study.objectives.asha import Asha
from hpolab.stores.trial_states import PAUSED as PAUSED_ATTR


def _trial(number: int, curve: dict[int, float], paused_epoch: int | None = None, state=TrialState.RUNNING):
    attrs = {PAUSED_ATTR: {"rung": 0, "epoch": paused_epoch} if paused_epoch else None}
    t = optuna.trial.create_trial(state=state, intermediate_values=curve, system_attrs=attrs,
                                  value=max(curve.values()) if state == TrialState.COMPLETE else None)
    t.number = number
    return t


def test_segments_in_training_count_the_epochs_they_will_train():
    s = Asha(None, min_epochs=1, max_epochs=4, eta=2, brackets=1, direction="maximize")  # rungs 1, 2, 4
    fresh = _trial(0, {})  # trains to rung 0: 1 epoch
    resumed = _trial(1, {1: 0.5, 2: 0.6})  # promoted from epoch 2: trains to 4
    halfway = _trial(2, {1: 0.5, 2: 0.6, 3: 0.7})  # 1 epoch left
    assert epochs_in_flight(s, [fresh]) == 1
    assert epochs_in_flight(s, [resumed]) == 2
    assert epochs_in_flight(s, [fresh, resumed, halfway]) == 4
    paused = _trial(3, {1: 0.5}, paused_epoch=1)  # no process: trains nothing now
    done = _trial(4, {1: 0.5, 2: 0.6, 4: 0.7}, state=TrialState.COMPLETE)
    assert epochs_in_flight(s, [paused, done]) == 0


@pytest.mark.slow
def test_two_slots_do_not_spend_the_last_epochs_twice(store):
    out = run_cli("--store", str(store), "study", "run", "studies/digits_asha.yaml", "name=asha-flight", "n_trials=5",
                  "parallel=2", "budget.epochs=6")
    used = int(re.search(r"epochs used: (\d+) / 6", out.stdout).group(1))
    assert 6 <= used <= 7, out.stdout  # the last segment started may go 1 past (a promotion from epoch 2 trains 2)
    _, study = open_study(store, "asha-flight")
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.get_trials())


def test_the_epochs_line_says_how_far_over_the_budget_it_went():
    from hpolab.analysis.status import epochs_line
    from hpolab.stores.optuna_sql import TrialRow

    rows = [TrialRow(0, "COMPLETE", 0.9, {}, 4, None, {PAUSED_ATTR: None}), TrialRow(1, "PRUNED", None, {}, 2, None, {PAUSED_ATTR: {"rung": 1, "epoch": 2}})]
    assert epochs_line(rows, 5) == "epochs used: 6 / 5 (budget.epochs; 1 over: the last segments started trained to their rung); 0 paused, 1 pruned at a rung (never promoted)"
    assert epochs_line(rows, 6).startswith("epochs used: 6 / 6 (budget.epochs); ")
