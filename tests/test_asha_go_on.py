"""A trial at its ASHA rung goes on in its process only when the claim right after its pause would
resume it (decided under the budget lock on a fresh read of a real SQLite study), and never while its
driver may not resume a trial (a stop signal, a drain, `study pause`): then it pauses as always."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest

from conftest import FAULT_PROJECT, FAULT_SPEC

ASHA = "trial_scheduler={type: asha, min_epochs: 1, max_epochs: 4, reduction_factor: 2, brackets: 1}"


def _pauses(store, may_resume):
    """A study with trial 0 paused at rung 0 (epoch 1, val_acc 0.5) and trial 1 training, at epoch 1."""
    from hpolab.config.spec import load_spec
    from hpolab.stores.trial_states import PAUSED
    from hpolab.study.driver.pauses import Pauses
    from hpolab.study.objectives.schedulers import scheduler_for
    from hpolab.study.trials.runner import Running

    spec = load_spec(FAULT_PROJECT / FAULT_SPEC, ["n_trials=4", ASHA])
    study = optuna.create_study(study_name=spec.name, storage=f"sqlite:///{store / 'optuna.db'}", direction="maximize")
    paused = study.ask()
    paused.report(0.5, 1)
    study._storage.set_trial_system_attr(paused._trial_id, PAUSED, {"rung": 0, "epoch": 1})
    training = study.ask()
    tags, lines = [], []
    tracker = SimpleNamespace(set_tags_later=lambda r, t: tags.append(t))
    progress = SimpleNamespace(note=lines.append, trial_promoted=lambda *a: lines.append(a))
    stores = SimpleNamespace(trial_dir=lambda name, n: store / "trials" / name / f"trial-{n}")
    pauses = Pauses(scheduler_for(spec, stores), spec, stores, study, study._storage, {}, tracker, progress,
                    lambda f, *a, **k: f(*a, **k), may_resume=may_resume)
    r = Running(trial=training, run_id="r", config={}, trial_dir=store, epoch=1)
    return pauses, r, study, tags


@pytest.mark.parametrize("value, goes_on", [(0.9, True), (0.1, False)])
def test_the_best_at_its_rung_goes_on_and_a_worse_one_pauses(store, value, goes_on):
    pauses, r, study, tags = _pauses(store, lambda: True)
    r.trial.report(value, 1)
    replies = []
    assert pauses.go_on(r, 1, value, lambda: replies.append("continue")) is goes_on
    t = study.trials[r.number]
    if goes_on:  # recorded as a resumed segment is, then the process told; the run's tags queued
        assert replies == ["continue"] and t.user_attrs["hpolab.rung"] == 0
        assert t.system_attrs["hpolab.segment_after"] == 1 and t.system_attrs["hpolab.segment_until"] == {"epoch": 2, "rung": 1}
        assert "hpolab.paused" not in t.system_attrs and pauses.pause_at[r.number] == 2
        assert tags == [{"hpolab.rung": "0", "hpolab.promoted_from_rung": "0"}]
    else:  # trial 0 (0.5) is the one the claim would resume: this one pauses, nothing written
        assert replies == [] and "hpolab.rung" not in t.user_attrs and tags == []


def test_a_driver_that_may_not_resume_lets_the_best_at_its_rung_pause(store):
    pauses, r, study, tags = _pauses(store, lambda: False)  # a stop signal, a drain or `study pause`
    r.trial.report(0.9, 1)
    replies = []
    assert pauses.go_on(r, 1, 0.9, lambda: replies.append("continue")) is False
    assert replies == [] and "hpolab.rung" not in study.trials[r.number].user_attrs and tags == []
