"""The standby trial process (study/trials/runner.py): while trials train, the driver forks the next
trial's process, which imports the experiment and loads the spec's data before any trial is claimed.
Through the real CLI on the fault project's `marked_loads` experiment, whose load_data notes which
process called it and from which folder: every trial after the first starts in the standby and
trains on the data it preloaded, and is reproduced identically; a load_data that draws from the global
RNG is loaded again by the trial itself (its weights stay those of a trial that loaded its own data);
a driver killed while a standby waits takes it along."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, open_study, run_cli, start_cli

ARGS = ["experiment=marked_loads", "parallel=1", "trainer.max_epochs=2", "log_models=none"]


def _loads(path: Path) -> list[tuple[int, str]]:
    if not path.exists():
        return []
    return [(int(pid), cwd) for pid, cwd in (line.split(" ", 1) for line in path.read_text().splitlines())]


def _env(loads: Path) -> dict[str, str]:
    return {**hpolab_env(), "HPOLAB_TEST_LOADS_FILE": str(loads)}


def _preloading(cwd: str) -> bool:
    return Path(cwd).name.startswith("hpolab-preload-")  # (train/builtin.py: a preload's empty folder)


def _in_trial_folders(loads, store: Path) -> list[str]:
    return [cwd for _, cwd in loads if Path(cwd).parent == store / "trials" / "faulty"]


def _reproduced(store: Path, study) -> None:
    for t in study.get_trials():
        out = run_cli("--store", str(store), "reproduce", t.user_attrs["mlflow_run_id"], cwd=FAULT_PROJECT)
        assert "reproduced: identical" in out.stdout, out.stdout


@pytest.mark.slow
def test_trials_after_the_first_start_in_the_standby_on_the_data_it_preloaded(store, tmp_path):
    loads = tmp_path / "loads.txt"
    run_cli("--store", str(store), "study", "run", FAULT_SPEC, "n_trials=3", *ARGS, cwd=FAULT_PROJECT, env=_env(loads))
    _, study = open_study(store)
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 3
    seen = _loads(loads)
    # trial 0 loads its own data in its folder; trials 1 and 2 take a standby's, loaded before their
    # claim, in an empty folder of their own; none is forked after the last of n_trials started
    assert _in_trial_folders(seen, store) == [str(store / "trials" / "faulty" / "trial-0")], seen
    preloaded = [pid for pid, cwd in seen if _preloading(cwd)]
    assert len(preloaded) == 2 and len(set(preloaded)) == len(preloaded), seen
    _reproduced(store, study)


@pytest.mark.slow
def test_a_load_data_that_draws_from_the_global_rng_is_loaded_again_by_the_trial(store, tmp_path):
    loads = tmp_path / "loads.txt"
    run_cli("--store", str(store), "study", "run", FAULT_SPEC, "n_trials=3", "data.draw=true", *ARGS, cwd=FAULT_PROJECT, env=_env(loads))
    _, study = open_study(store)
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 3
    seen = _loads(loads)
    # each trial loads its own data after it was seeded (the standbys' preloads were dropped)
    assert sorted(_in_trial_folders(seen, store)) == [str(store / "trials" / "faulty" / f"trial-{n}") for n in range(3)], seen
    _reproduced(store, study)


def test_a_killed_standbys_preload_folder_is_removed_by_the_next_preload(tmp_path):
    import types

    from hpolab.train import builtin

    dead = subprocess.Popen(["true"])
    dead.wait()  # (a process id that is gone)
    left = Path(builtin.preload_folder(dead.pid))
    left.mkdir(exist_ok=True)
    (left / "cache.pt").write_text("x")  # what its load_data had written when it was killed
    exp = types.ModuleType("standby_sweep_probe")
    exp.load_data = lambda data, seed: object()
    assert builtin.builtin_train(exp).preload({}, 0)
    builtin._PRELOADED.clear()
    assert not left.exists()


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.slow
def test_a_driver_killed_while_a_standby_waits_takes_it_along(store, tmp_path):
    loads = tmp_path / "loads.txt"
    driver = start_cli("--store", str(store), "study", "run", FAULT_SPEC, "n_trials=2", "model.sleep=0.05",
                       *[a for a in ARGS if not a.startswith("trainer.max_epochs")], "trainer.max_epochs=30",
                       cwd=FAULT_PROJECT, env=_env(loads), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not [pid for pid, cwd in _loads(loads) if _preloading(cwd)]:
        assert time.monotonic() < deadline and driver.poll() is None, "no standby loaded the data while trial 0 trained"
        time.sleep(0.1)
    (standby,) = [pid for pid, cwd in _loads(loads) if _preloading(cwd)]
    assert not _gone(standby)
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while not _gone(standby):
        assert time.monotonic() < deadline, f"the standby {standby} outlived its driver"
        time.sleep(0.1)
    _, study = open_study(store)
    assert len(study.get_trials()) == 1  # the standby's trial was never claimed
    assert os.path.exists(store / "trials" / "faulty" / "trial-0")


def _read_relative() -> None:
    try:
        open("data.csv").close()  # (a trial's folder may hold one; the preload's folder never does)
    except FileNotFoundError:
        pass


@pytest.mark.parametrize("draw", [None, "random", "numpy", "torch", "writes", "reads", "lists"])
def test_a_preload_is_kept_only_when_load_data_leaves_every_global_rng_as_it_was_and_its_folder_alone(draw, tmp_path, monkeypatch):
    import random
    import types

    import numpy as np
    import torch

    from hpolab.train import builtin

    calls = []

    def load_data(data, seed):
        calls.append((dict(data), seed))
        {"random": random.random, "numpy": np.random.rand, "torch": lambda: torch.rand(1), None: lambda: None,
         "writes": lambda: Path("cache.pt").write_text("x"), "reads": _read_relative,
         "lists": lambda: os.listdir()}[draw]()
        np.random.default_rng(seed).permutation(10)  # a generator of its own: never the global one
        return object()

    monkeypatch.chdir(tmp_path)
    exp = types.ModuleType(f"standby_probe_{draw}")
    exp.load_data = load_data
    kept = builtin.builtin_train(exp).preload({"a": 1}, 3)
    key = builtin._data_key(exp, {"a": 1}, 3)
    assert kept == (draw is None) and (key in builtin._PRELOADED) == (draw is None)
    assert os.getcwd() == str(tmp_path) and not os.path.exists(builtin.preload_folder(os.getpid()))
    assert builtin._data_key(exp, {"a": 2}, 3) != key and builtin._data_key(exp, {"a": 1}, 4) != key
    builtin._PRELOADED.pop(key, None)
    assert calls == [({"a": 1}, 3)]


@pytest.mark.slow
def test_a_trial_process_imports_nothing_of_the_routine_or_torch_its_forkserver_had_not(store, tmp_path):
    # The forkserver preloads the routine (study/trials/trial_process.py): a trial forked from it,
    # directly (trial 0) or as a standby (trial 1), starts training without importing any of it again.
    imports = tmp_path / "imports"
    imports.mkdir()
    run_cli("--store", str(store), "study", "run", FAULT_SPEC, "n_trials=2", *ARGS, cwd=FAULT_PROJECT,
            env={**hpolab_env(), "HPOLAB_TEST_IMPORTS_DIR": str(imports)})
    found = {f.stem: f.read_text().split() for f in imports.iterdir()}
    assert len(found) == 2, found
    for names in found.values():
        assert [n for n in names if n.split(".")[0] in ("torch", "hpolab", "experiments")] == ["hpolab.study.trials.trial_entry"], names
