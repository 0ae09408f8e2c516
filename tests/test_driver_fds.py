"""A driver's own resources do not grow with its trials: its file descriptors stay flat over twelve
trials whose processes are still exiting when the next one starts (the driver runs in this process,
so its descriptors are the ones counted)."""

from __future__ import annotations

import os

import pytest

from conftest import FAULT_PROJECT, FAULT_SPEC

pytestmark = pytest.mark.slow


def test_the_drivers_file_descriptors_do_not_grow_with_the_trials(store, monkeypatch):
    # Each trial's process lingers 0.5 s after its result (model.linger): the driver retires it alive.
    # The driver runs in this process (its descriptors are the ones counted), from the project folder.
    from hpolab.config.spec import load_spec
    from hpolab.stores.paths import resolve_stores
    from hpolab.study.driver.driver import Driver
    from hpolab.study.driver.progress import Progress

    fds: dict[int, int] = {}

    class CountingFds(Progress):
        def trial_finished(self, number, *args, **kwargs):
            fds[number] = len(os.listdir("/proc/self/fd"))
            super().trial_finished(number, *args, **kwargs)

    monkeypatch.chdir(FAULT_PROJECT)
    spec = load_spec(FAULT_PROJECT / FAULT_SPEC, ["n_trials=12", "parallel=1", "trainer.max_epochs=1", "log_models=none",
                                                  "model.linger=0.5", "search_space={}"])
    outcome = Driver(spec, resolve_stores(str(store)), CountingFds(spec, quiet=True), project_dir=FAULT_PROJECT).run()
    assert outcome.counts["complete"] == 12, fds
    assert fds[11] - fds[3] <= 3, fds  # before: one more descriptor for every trial still exiting when it ended
