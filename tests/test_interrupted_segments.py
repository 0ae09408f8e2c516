"""A trial scheduler's segment that died with its driver is put back to paused in the same trial
(driver/pauses.py): the scheduler resumes it first, a driver that still runs it (a stall, not a death)
learns it lost it, and after max_interrupts the reaper fails it as any trial. The end-to-end runs are
the SIGKILL tests of test_asha_study.py and test_pbt_study.py."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from hpolab.study.driver.heartbeat import PUT_BACK, put_back_reason
from hpolab.study.driver.pauses import Pauses
from hpolab.study.objectives.asha import Asha
from hpolab.study.objectives.trial_scheduler import INTERRUPTS_ATTR, PAUSED_ATTR
from hpolab.study.state.owners import OWNER_ATTR, owner_record


def _study(*attrs: tuple[dict, dict, dict]) -> list:
    """Trials (RUNNING) with (intermediate values, system attrs, user attrs), in order."""
    study = optuna.create_study(direction="maximize")
    for values, system, user in attrs:
        study.add_trial(optuna.create_trial(state=TrialState.RUNNING, params={"lr": 0.1}, distributions={"lr": FloatDistribution(0.01, 1)},
                                            intermediate_values=values, system_attrs=system, user_attrs=user))
    return study.get_trials()


def test_an_interrupted_segment_resumes_first_even_where_asha_would_promote_another():
    asha = Asha(None, min_epochs=1, max_epochs=4, eta=2, brackets=1, direction="maximize")
    trials = _study(
        ({1: 0.9, 2: 0.9}, {PAUSED_ATTR: {"rung": 1, "epoch": 2}}, {}),  # the best at rung 1: promotable
        ({1: 0.5, 2: 0.1}, {PAUSED_ATTR: {"rung": 1, "epoch": 2}}, {}),
        ({1: 0.2}, {PAUSED_ATTR: {"rung": 0, "epoch": 1, "interrupted": True, "after": 1, "logged": 2}}, {}),  # worst, killed mid-segment
    )
    assert asha.next_resume(trials[:2]).number == 0
    assert asha.next_resume(trials).number == 2


def test_a_driver_still_running_a_put_back_trial_learns_it_lost_it():
    me = owner_record(0)
    other = {**owner_record(2), "pid": me["pid"] + 1}  # (a record names its trial)
    mine, put_back, claimed = _study(
        ({1: 0.5}, {}, {OWNER_ATTR: me}),
        ({1: 0.5}, {PAUSED_ATTR: {"rung": 0, "epoch": 1, "interrupted": True}}, {OWNER_ATTR: {"trial": 1, "paused": True}}),
        ({1: 0.5}, {}, {OWNER_ATTR: other}),
    )
    assert put_back_reason(mine) is None
    assert put_back_reason(put_back).startswith(PUT_BACK)
    assert put_back_reason(claimed).startswith(PUT_BACK) and str(other["pid"]) in put_back_reason(claimed)


def test_a_trial_put_back_max_interrupts_times_is_reaped_as_any_trial():
    pauses = Pauses(None, SimpleNamespace(max_interrupts=2), None, None, None, {}, None, SimpleNamespace(note=print), None)
    (t,) = _study(({1: 0.5}, {INTERRUPTS_ATTR: 2}, {}))
    assert pauses.put_back(t, "its driver is gone") is False  # (before it touches any store)
