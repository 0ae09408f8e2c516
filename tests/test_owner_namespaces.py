"""Containers that share a host name but not their PIDs (`hostNetwork`, `docker run --network host`):
a driver's pid means nothing in another PID namespace, so an owner record there is judged by its
heartbeats only, never reaped at once on a pid check. Fabricated owner records, then a real driver-like
process in its own PID namespace (`unshare --pid`, where this machine lets us make one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from optuna.trial import TrialState

from hpolab.study.state.owners import why_dead
from hpolab.study.state.owners import OWNER_ATTR, owner_gone, owner_record


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _trial(rec: dict) -> SimpleNamespace:
    """A RUNNING trial of another driver, as why_dead reads it."""
    return SimpleNamespace(number=rec["trial"], _trial_id=100 + rec["trial"], user_attrs={OWNER_ATTR: rec}, system_attrs={},
                           state=TrialState.RUNNING)  # (why_dead first asks whether a trial scheduler paused it)


def test_a_pid_of_another_pid_namespace_is_not_trusted_its_heartbeat_decides():
    same = {**owner_record(0), "pid": _dead_pid()}
    other = {**same, "pid_ns": "pid:[1]"}  # same host, same boot, a PID namespace that is not ours
    assert same["pid_ns"] == os.readlink("/proc/self/ns/pid")
    # the same namespace: a dead pid is a dead owner, at once (as before)
    assert "is gone" in owner_gone(same)
    assert why_dead(_trial(same), stale_ids=set(), storage=None)[0] == "owner_gone"
    # another namespace: alive while its heartbeat is fresh, stale once it is not
    assert owner_gone(other) is None
    assert why_dead(_trial(other), stale_ids=set(), storage=None) is None
    assert why_dead(_trial(other), stale_ids={100}, storage=None)[0] == "stale"
    # a record that cannot say its namespace (written where /proc/self/ns is absent): not trusted either
    assert owner_gone({**same, "pid_ns": None}) is None
    # a record from before namespaces were recorded: today's rule (the pid check)
    assert "is gone" in owner_gone({k: v for k, v in same.items() if k != "pid_ns"})


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning", "ignore:Heartbeat of storage")
def test_the_reaper_waits_for_the_heartbeat_of_an_owner_in_another_pid_namespace(store):
    """Two RUNNING trials with fresh heartbeats whose owner records name this host and a dead pid: the one
    in our PID namespace is reaped at once (as before), the one in another namespace is left running."""
    import optuna

    from hpolab.stores.optuna_storage import make_storage
    from hpolab.study.driver.heartbeat import reap_dead_trials
    from hpolab.study.state.retry import RetryCopy

    storage = make_storage(f"sqlite:///{store / 'optuna.db'}")  # as a driver opens it: with heartbeats
    study = optuna.create_study(study_name="ns", storage=storage)
    trials = [study.ask() for _ in range(2)]
    for t, ns in zip(trials, (os.readlink("/proc/self/ns/pid"), "pid:[1]")):
        storage.set_trial_user_attr(t._trial_id, OWNER_ATTR, {**owner_record(t.number), "pid": _dead_pid(), "pid_ns": ns})
        storage.set_trial_user_attr(t._trial_id, "mlflow_run_id", f"run-{t.number}")  # (running: its run was made)
        storage.record_heartbeat(t._trial_id)
    notes: list[str] = []
    assert reap_dead_trials(study, storage, {}, RetryCopy(1), close_run=lambda *a: None, note=notes.append) == []
    states = [t.state.name for t in study.get_trials()]
    assert states[:2] == ["FAIL", "RUNNING"] and len(notes) == 1 and "trial 0" in notes[0], (states, notes)


def test_a_live_owner_in_its_own_pid_namespace_is_not_reaped():
    """A real process in a new PID namespace (pid 1 there; our pid 1 is another process) writes its
    owner record; seen from here, with the same host name, it must not look gone."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    code = ("import json, sys, time; from hpolab.study.state.owners import owner_record; "
            "print(json.dumps(owner_record(0)), flush=True); sys.stdin.read()")
    p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        if not line:
            pytest.skip(f"cannot make a PID namespace here: {p.stderr.read().strip()}")
        rec = json.loads(line)
        assert rec["host"] == owner_record(0)["host"] and rec["pid"] == 1
        assert owner_gone(rec) is None, rec
        assert rec["pid_ns"] != os.readlink("/proc/self/ns/pid")
        assert why_dead(_trial(rec), stale_ids=set(), storage=None) is None
    finally:
        p.stdin.close()
        p.wait(timeout=10)
