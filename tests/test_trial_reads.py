"""What a driver reads per trial start: every trial once, under the budget lock, for both the reap and
the claim (each read fetches every unfinished trial, the paused ones of a trial scheduler too, so a
read costs O(trials)); a trial that is no retry copy is not read again to find what it continues, and
a new trial is asked without Optuna's look for a WAITING one when that read found none."""

from __future__ import annotations

import sys
from collections import Counter

import optuna
import pytest

from conftest import FAULT_PROJECT, FAULT_SPEC

pytestmark = pytest.mark.slow


def test_a_trial_start_reads_every_trial_once_and_reaps_only_when_that_read_finds_a_dead_drivers_trial(store, monkeypatch):
    from hpolab.config.spec import load_spec
    from hpolab.stores.paths import resolve_stores
    from hpolab.study.driver.driver import Driver
    from hpolab.study.driver.progress import Progress

    readers: Counter = Counter()
    get_trials = optuna.Study.get_trials

    def counted(self, *args, **kwargs):
        readers[sys._getframe(1).f_code.co_name] += 1
        return get_trials(self, *args, **kwargs)

    monkeypatch.setattr(optuna.Study, "get_trials", counted)
    reaps: Counter = Counter()
    reap = Driver.reap
    monkeypatch.setattr(Driver, "reap", lambda self: reaps.update(["reap"]) or reap(self))
    pop = optuna.Study._pop_waiting_trial_id  # ask()'s look for a WAITING trial: a read of every unfinished one
    monkeypatch.setattr(optuna.Study, "_pop_waiting_trial_id", lambda self: readers.update(["ask's look for WAITING"]) or pop(self))
    monkeypatch.chdir(FAULT_PROJECT)
    spec = load_spec(FAULT_PROJECT / FAULT_SPEC, ["n_trials=3", "parallel=1", "trainer.max_epochs=1", "log_models=none", "search_space={}"])
    outcome = Driver(spec, resolve_stores(str(store)), Progress(spec, quiet=True), project_dir=FAULT_PROJECT).run()
    assert outcome.counts["complete"] == 3
    assert readers["retry_source"] == 0, readers  # before: one read of every trial per trial start
    assert readers["reap_dead_trials"] == 0, readers  # before: a second read in every reap
    # each start reads once, under the lock, and looks for dead drivers' trials on that read (before:
    # a reap with a read of its own first); with none dead, the only reap is the one at the loop's end
    assert readers["claim_next"] >= 3 and readers["reap"] == reaps["reap"] == 1, (readers, reaps)
    assert readers["ask's look for WAITING"] == 0, readers  # the claim's read found none: a new trial is asked without it
