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
from hpolab.study.state.owners import pid_namespace, process_start_time
from hpolab.study.trials.host_slots import DIR_ENV, HostSlots
from hpolab.train.cpus import available_cpus


def _entry(folder: Path, pid: int, cpus: list[int], slots: int, started: str | None, pidns=pid_namespace()) -> Path:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / f"{pid}.json"
    path.write_text(json.dumps({"cpus": cpus, "slots": slots, "started": started, "pidns": pidns}))
    return path


def test_the_trials_live_drivers_run_on_overlapping_cpus_are_counted_the_dead_are_removed(tmp_path):
    folder = tmp_path / "slots"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])  # exits, not reaped (a SIGKILLed driver's state)
    zombie_started = process_start_time(zombie.pid)
    try:
        me = HostSlots({0, 1}, parallel=1, folder=folder)
        assert me.sharing() == 1  # not held, nothing else: its own parallel
        me.hold()
        assert json.loads(me.path.read_text())["slots"] == 1  # its loop starts its trials at once: its parallel
        me.running(1)
        assert json.loads(me.path.read_text())["slots"] == 1
        assert me.sharing() == 1  # its own entry is not counted twice

        _entry(folder, other.pid, [1, 2], 2, process_start_time(other.pid))  # runs 2 trials, overlaps on CPU 1: counted
        assert me.sharing() == 3
        _entry(folder, other.pid, [1, 2], 0, process_start_time(other.pid))  # the same driver, waiting: counts nothing
        assert me.sharing() == 1
        _entry(folder, other.pid, [2, 3], 2, process_start_time(other.pid))  # bound to other CPUs: not counted
        assert me.sharing() == 1

        while process_start_time(zombie.pid) is not None:
            time.sleep(0.05)
        dead = [_entry(folder, gone.pid, [0], 4, "1"),  # its driver died: ignored, and the file removed
                _entry(folder, zombie.pid, [0], 4, zombie_started),  # killed, not reaped yet: likewise
                _entry(folder, other.pid, [0], 4, "0")]  # a live pid, started at another time: another process
        assert me.sharing() == 1
        assert not any(p.exists() for p in dead)
        elsewhere = _entry(folder, 1, [0], 4, None, pidns=12345)  # another pid namespace: neither counted nor removed
        assert me.sharing() == 1 and elsewhere.exists()

        me.path.unlink()  # (another reader took it for a dead driver's: its pid was reused meanwhile)
        me.sharing()
        assert json.loads(me.path.read_text())["slots"] == 1
        me.release()
        assert not me.path.exists()
    finally:
        other.kill()
        other.wait()
        zombie.wait()


def test_a_folder_that_is_not_this_users_own_or_cannot_be_made_is_not_used(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    me = HostSlots({0}, parallel=2, folder=blocker / "slots")  # (a folder under a file: cannot be made)
    me.hold()
    assert not me.held and me.sharing() == 2
    shared = tmp_path / "open"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # (others could plant entries here that decide our threads)
    _entry(shared, os.getppid(), [0], 8, process_start_time(os.getppid()))
    me = HostSlots({0}, parallel=2, folder=shared)
    me.hold()
    assert not me.held and me.sharing() == 2


def _slots(path: Path) -> int | None:
    try:
        return json.loads(path.read_text())["slots"]
    except (OSError, ValueError):
        return None


@pytest.mark.slow
def test_a_second_driver_on_the_same_cpus_gives_its_trials_half_the_threads(store, tmp_path):
    """Two `hpolab study run`s of two studies on one machine, neither bound to CPUs: while the first
    runs its trials, the second's trials record (and set) half the CPUs as their torch threads; alone,
    a driver at parallel=1 gives a trial all of them."""
    cpus = available_cpus()
    if cpus < 2:
        pytest.skip("needs 2 CPUs: with one, every trial gets 1 thread either way")
    slots = tmp_path / "slots"
    env = {**hpolab_env(), DIR_ENV: str(slots)}
    hpolab = str(Path(sys.executable).with_name("hpolab"))
    common = ["parallel=1", "trainer.max_epochs=1", "log_models=none"]
    # the first runs one long trial (its entry says 1 trial all along), the second two short ones
    first = subprocess.Popen([hpolab, "--store", str(tmp_path / "first"), "study", "run", FAULT_SPEC, "name=first",
                              "n_trials=1", "parallel=1", "trainer.max_epochs=100000", "trainer.early_stopping_patience=null",
                              "model.sleep=0.05", "log_models=none"],
                             cwd=FAULT_PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while _slots(slots / f"{first.pid}.json") != 1:
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first driver never said it runs a trial"
            time.sleep(0.2)
        second = subprocess.run([hpolab, "--store", str(store), "study", "run", FAULT_SPEC, "n_trials=2", *common],
                                cwd=FAULT_PROJECT, env=env, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, second.stderr
        assert first.poll() is None, "the first driver ended before the second did: nothing was shared"
    finally:
        first.send_signal(signal.SIGTERM)
        try:
            first.wait(timeout=120)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
    assert not (slots / f"{first.pid}.json").exists(), "a driver that stopped left its slot held"
    client, study = open_study(store)
    assert [trial_run(t, client).data.tags["hpolab.torch_threads"] for t in study.trials] == [str(cpus // 2)] * 2

    alone = subprocess.run([hpolab, "--store", str(store), "study", "run", FAULT_SPEC, "n_trials=3", *common],
                           cwd=FAULT_PROJECT, env=env, capture_output=True, text=True, timeout=600)
    assert alone.returncode == 0, alone.stderr
    client, study = open_study(store)
    assert trial_run(study.trials[-1], client).data.tags["hpolab.torch_threads"] == str(cpus)


def test_a_driver_between_two_trials_still_counts_them(tmp_path, monkeypatch):
    """Between two trials a driver runs none for a moment: another driver's trial starting then would
    take its threads for its whole length. A fall is written once it has lasted SETTLE_S."""
    from hpolab.study.trials import host_slots

    clock = [100.0]
    monkeypatch.setattr(host_slots.time, "monotonic", lambda: clock[0])
    me = HostSlots({0, 1}, parallel=2, folder=tmp_path / "slots")
    me.hold()
    me.running(2)
    assert _slots(me.path) == 2  # a rise: at once
    me.running(0)
    clock[0] += host_slots.SETTLE_S / 2
    me.running(1)
    assert _slots(me.path) == 2  # a moment between trials: still 2
    me.running(2)
    clock[0] += host_slots.SETTLE_S
    me.running(1)
    assert _slots(me.path) == 2
    clock[0] += host_slots.SETTLE_S
    me.running(1)
    assert _slots(me.path) == 1  # fewer for SETTLE_S: written
    me.release()


@pytest.mark.slow
def test_two_workers_started_together_count_each_others_first_trials(store, tmp_path):
    """Two `hpolab worker`s of one study started at the same moment on unbound CPUs: every trial, the
    first ones too, gets the CPUs divided by both workers' trials (each used to see the other's entry
    at 0 and take all of them; under ASHA a trial keeps its first segment's count)."""
    cpus = available_cpus()
    if cpus < 2:
        pytest.skip("needs 2 CPUs: with one, every trial gets 1 thread either way")
    env = {**hpolab_env(), DIR_ENV: str(tmp_path / "slots")}
    hpolab = str(Path(sys.executable).with_name("hpolab"))
    args = [hpolab, "--store", str(store), "worker", FAULT_SPEC, "n_trials=4", "parallel=1", "trainer.max_epochs=2", "log_models=none",
            "trial_scheduler={type: asha, min_epochs: 1, max_epochs: 2, reduction_factor: 2}"]
    workers = [subprocess.Popen(args, cwd=FAULT_PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    for w in workers:
        assert w.wait(timeout=600) == 0, w.stderr.read()
    client, study = open_study(store)
    threads = [trial_run(t, client).data.tags["hpolab.torch_threads"] for t in study.trials]
    assert threads[:2] == [str(cpus // 2)] * 2, threads  # the first trial of each
