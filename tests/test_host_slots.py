"""Drivers on one host share its CPUs (study/trials/host_slots.py): a trial's torch threads are its
driver's CPUs divided by the trial slots of every live driver on overlapping CPUs. Two workers on a
2-core machine each gave their trials 2 threads before, and their OpenMP threads spun against each other
(0.8 one-epoch trials/s on team stores, 4.7 with one thread each)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, open_study, trial_run
from hpolab.study.trials.host_slots import DIR_ENV, HostSlots, _started


def _entry(folder: Path, pid: int, cpus: list[int], slots: int, started: str | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{pid}.json"
    path.write_text(json.dumps({"cpus": cpus, "slots": slots, "started": started}))
    return path


def test_slots_of_live_drivers_on_overlapping_cpus_are_counted_the_dead_are_removed(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        me = HostSlots({0, 1}, parallel=1, folder=tmp_path)
        assert me.sharing() == 1  # not held, nothing else: its own parallel
        me.hold()
        assert json.loads(me.path.read_text())["slots"] == 1
        assert me.sharing() == 1  # its own entry is not counted twice

        _entry(tmp_path, other.pid, [1, 2], 2, _started(other.pid))  # overlaps on CPU 1: counted
        assert me.sharing() == 3
        (tmp_path / f"{other.pid}.json").unlink()
        _entry(tmp_path, other.pid, [2, 3], 2, _started(other.pid))  # bound to other CPUs: not counted
        assert me.sharing() == 1

        dead = _entry(tmp_path, gone.pid, [0], 4, "1")  # its driver died: ignored, and the file removed
        reused = _entry(tmp_path, other.pid, [0], 4, "0")  # a live pid, started at another time: another process
        assert me.sharing() == 1
        assert not dead.exists() and not reused.exists()

        me.release()
        assert not me.path.exists()
    finally:
        other.kill()
        other.wait()


def test_an_unwritable_folder_leaves_a_driver_counting_its_own_slots(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    me = HostSlots({0}, parallel=2, folder=blocker / "slots")  # (a folder under a file: cannot be made)
    me.hold()
    assert not me.held and me.sharing() == 2


@pytest.mark.slow
def test_a_second_driver_on_the_same_cpus_gives_its_trials_half_the_threads(store, tmp_path):
    """Two `hpolab study run`s of two studies on one machine, neither bound to CPUs: while the first
    runs its trials, the second's trials record (and set) half the CPUs as their torch threads; alone,
    a driver at parallel=1 gives a trial all of them."""
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("needs 2 CPUs: with one, every trial gets 1 thread either way")
    slots = tmp_path / "slots"
    env = {**hpolab_env(), DIR_ENV: str(slots)}
    hpolab = str(Path(sys.executable).with_name("hpolab"))
    common = ["parallel=1", "trainer.max_epochs=1", "log_models=none"]
    first = subprocess.Popen([hpolab, "--store", str(tmp_path / "first"), "study", "run", FAULT_SPEC, "name=first",
                              "n_trials=500", *common], cwd=FAULT_PROJECT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (slots / f"{first.pid}.json").exists():
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first driver never held its slot"
            time.sleep(0.2)
        second = subprocess.run([hpolab, "--store", str(store), "study", "run", FAULT_SPEC, "n_trials=2", *common],
                                cwd=FAULT_PROJECT, env=env, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, second.stderr
        assert first.poll() is None, "the first driver ended before the second did: nothing was shared"
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    assert not (slots / f"{first.pid}.json").exists(), "a driver that stopped left its slot held"
    client, study = open_study(store)
    assert [trial_run(t, client).data.tags["hpolab.torch_threads"] for t in study.trials] == [str(cpus // 2)] * 2

    alone = subprocess.run([hpolab, "--store", str(store), "study", "run", FAULT_SPEC, "n_trials=3", *common],
                           cwd=FAULT_PROJECT, env=env, capture_output=True, text=True, timeout=600)
    assert alone.returncode == 0, alone.stderr
    client, study = open_study(store)
    assert trial_run(study.trials[-1], client).data.tags["hpolab.torch_threads"] == str(cpus)
