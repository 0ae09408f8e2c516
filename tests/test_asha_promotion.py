"""ASHA's promotion choices on fabricated trials (no training): rungs, top 1/eta, ties, brackets,
direction, nothing promotable, never the same trial twice."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from hpolab.study.objectives.asha import Asha, rungs
from hpolab.study.objectives.trial_scheduler import RUNG_ATTR
from hpolab.stores.trial_states import PAUSED as PAUSED_ATTR


def paused(number: int, curve: dict[int, float], epoch: int, rung: int = 0) -> optuna.trial.FrozenTrial:
    t = optuna.trial.create_trial(state=TrialState.RUNNING, intermediate_values=curve,
                                  system_attrs={PAUSED_ATTR: {"rung": rung, "epoch": epoch}}, user_attrs={RUNG_ATTR: rung})
    t.number = number
    return t


def running(number: int, curve: dict[int, float]) -> optuna.trial.FrozenTrial:
    t = optuna.trial.create_trial(state=TrialState.RUNNING, intermediate_values=curve)
    t.number = number
    return t


def asha(eta=3, brackets=1, direction="maximize", min_epochs=1, max_epochs=27) -> Asha:
    return Asha(None, min_epochs=min_epochs, max_epochs=max_epochs, eta=eta, brackets=brackets, direction=direction)


def test_rungs_per_bracket():
    assert rungs(1, 27, 3) == [1, 3, 9, 27]
    assert rungs(1, 27, 3, bracket=1) == [3, 9, 27]
    assert rungs(1, 4, 2) == [1, 2, 4]
    assert rungs(2, 5, 2) == [2, 4, 5]
    s = asha(max_epochs=4, eta=2)
    t = running(0, {})
    assert [s.pause_epoch(t, start) for start in (1, 2, 3, 4)] == [1, 2, None, None]


def test_top_third_of_a_rung_is_promoted_the_rest_waits():
    s = asha()
    trials = [paused(i, {1: v}, 1) for i, v in enumerate([0.5, 0.9, 0.7])]
    assert s.next_resume(trials).number == 1  # floor(3/3) = 1: the best of the three
    trials[1] = running(1, {1: 0.9})  # promoted: it runs now, nobody else qualifies
    assert s.next_resume(trials) is None
    assert s.next_resume(trials[:2]) is None  # two reached: floor(2/3) = 0


def test_minimize_promotes_the_smallest():
    s = asha(direction="minimize", eta=2)
    trials = [paused(i, {1: v}, 1) for i, v in enumerate([0.5, 0.1, 0.7, 0.3])]
    assert [t.number for t in s.promotable(trials)] == [1, 3]


def test_ties_go_to_the_earlier_configuration():
    s = asha(eta=2)
    trials = [paused(i, {1: 0.5}, 1) for i in range(4)]
    assert [t.number for t in s.promotable(trials)] == [0, 1]


def test_highest_rung_first_and_finished_trials_count_in_rungs():
    s = asha(eta=2, max_epochs=4)
    done = optuna.trial.create_trial(state=TrialState.COMPLETE, value=0.1, intermediate_values={1: 0.1, 2: 0.1, 3: 0.1, 4: 0.1})
    done.number = 0
    trials = [done, paused(1, {1: 0.9, 2: 0.8}, 2, rung=1), paused(2, {1: 0.95}, 1), paused(3, {1: 0.2}, 1)]
    # rung 1 (epoch 2): two reached, trial 1 is the top one; rung 0: four reached, trials 2 and 1 on top
    assert [t.number for t in s.promotable(trials)] == [1, 2]


def test_brackets_compare_within_their_own_rungs():
    s = asha(eta=2, brackets=2, max_epochs=8)
    # even configurations: bracket 0 (rungs 1, 2, 4); odd ones: bracket 1 (rungs 2, 4)
    trials = [paused(0, {1: 0.9}, 1), paused(1, {1: 0.1, 2: 0.99}, 2), paused(2, {1: 0.1}, 1), paused(3, {1: 0.1, 2: 0.2}, 2)]
    assert [t.number for t in s.promotable(trials)] == [1, 0]
    assert s.pause_epoch(trials[1], 1) == 2


def test_a_retry_copy_is_its_configuration_and_the_failed_attempt_is_not_counted():
    s = asha(eta=2, brackets=2, max_epochs=8)
    failed = optuna.trial.create_trial(state=TrialState.FAIL, intermediate_values={1: 0.99})
    failed.number = 0
    copy = paused(5, {1: 0.99}, 1)
    copy.system_attrs.update({"failed_trial": 0, "retry_history": [0]})  # bracket of trial 0, not of 5 (as retry.py writes it)
    other = paused(2, {1: 0.1}, 1)
    assert s.bracket_of(copy) == 0
    assert [t.number for t in s.promotable([failed, copy, other])] == [5]


def test_nan_is_never_promoted_and_at_end_prunes_with_the_rung():
    s = asha(eta=2)
    trials = [paused(0, {1: float("nan")}, 1), paused(1, {1: 0.1}, 1)]
    assert [t.number for t in s.promotable(trials)] == [1]
    ends = s.at_end([trials[0]])
    assert ends == [(0, "PRUNED", {"hpolab.pruned_at_rung": "0", "hpolab.pruned_at_epoch": "1", "hpolab.stop_reason": "asha_not_promoted"})]


@pytest.mark.parametrize("eta", [2, 3])
def test_never_promotes_the_same_trial_twice_from_a_rung(eta):
    s = asha(eta=eta)
    trials = [paused(i, {1: i / 10}, 1) for i in range(9)]
    promoted = []
    while (r := s.next_resume(trials)) is not None:
        promoted.append(r.number)
        trials[r.number] = running(r.number, trials[r.number].intermediate_values)
    assert sorted(promoted) == list(range(9))[-(9 // eta):]
