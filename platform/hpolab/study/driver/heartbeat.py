"""Heartbeats of the running trials, and the reaper of trials whose driver stopped beating.

Optuna's heartbeat marks a RUNNING trial as alive; a trial without one for GRACE_PERIOD seconds is
stale (its driver was killed or its machine lost). A trial whose owner (owners.py) ran on this host,
in this PID namespace, and is gone is dead at once, without waiting for the grace period. The reaper fails dead trials,
queues a WAITING retry copy (retry.py), and closes their MLflow runs so none stays RUNNING forever.
A trial scheduler's dead segment is no FAIL: it is put back to paused in the same trial and run
(pauses.py), until it was put back max_interrupts times; a driver still running it then learns it lost it.

A reaped trial is marked (system attr `hpolab.reaped`: who reaped it and why). Its owner may still be
alive (a heartbeat write failed, a long stall): the owner's heartbeat thread reads the trial's state
after each beat and, once Optuna no longer has it RUNNING, marks it lost (`Running.lost`); the
driver then stops the child and records the run as Optuna has it (FAIL, no model, no second retry).

Through Optuna's gRPC storage proxy there is no Optuna heartbeat (GrpcStorageProxy is no
BaseHeartbeat). The driver then beats by writing the trial's system attr `hpolab.heartbeat` (the
writer's wall-clock time), and other drivers watch it change (`AttrBeats`): a trial whose attr has
not changed for GRACE_PERIOD seconds, as timed by the reader, is stale like an RDB one.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from hpolab.stores.optuna_storage import GRACE_PERIOD, HEARTBEAT_INTERVAL
from hpolab.stores.trial_states import OWNED, State, paused_mark, state_of
from hpolab.study.state import lifecycle
from hpolab.study.state.lifecycle import REAPED  # noqa: F401 -- (events.py and check read it here)
from hpolab.study.state.outage import passthrough
from hpolab.study.state.owners import HEARTBEAT_ATTR, describe, heartbeat_age, owner_of, this_host, why_dead  # noqa: F401
from hpolab.study.state.retry import RetryCopy
from hpolab.study.trials.runner import Lost, Running

# We call Optuna's heartbeat API from an ask/tell driver on purpose (its built-in heartbeat only
# covers Study.optimize); its "experimental" and "use with optimize" warnings are noise here.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def beat(storage, r: Running, force: bool = False) -> None:
    """Record a heartbeat for `r` if one is due (or `force`)."""
    now = time.monotonic()
    if not (force or now - r.last_heartbeat >= HEARTBEAT_INTERVAL):
        return
    if hasattr(storage, "record_heartbeat"):
        storage.record_heartbeat(r.trial._trial_id)
    else:  # the gRPC proxy: an attr write is the heartbeat (AttrBeats reads it)
        try:
            storage.set_trial_system_attr(r.trial._trial_id, HEARTBEAT_ATTR, time.time())
        except optuna.exceptions.UpdateFinishedTrialError:
            return  # another worker reaped it: lost_reason tells the driver
    r.last_heartbeat = now


class AttrBeats:
    """Which RUNNING trials stopped beating, for a storage without Optuna heartbeats (the proxy).

    Clock skew: the attr holds the writer's wall-clock time, but we never compare it with our clock
    (hosts' clocks may differ by more than the grace period). We remember the last value seen per
    trial and when (our time.monotonic()) we saw it change; a trial is stale once it has not changed
    for GRACE_PERIOD seconds of our own clock. A trial first seen now starts its grace now, so a
    worker that (re)starts waits one grace period before reaping anything."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[object, float]] = {}  # trial id -> (last value, when it changed)

    def silent_for(self, t) -> float:
        """Seconds (our clock) since trial `t`'s heartbeat attr last changed as we saw it."""
        now, value = time.monotonic(), t.system_attrs.get(HEARTBEAT_ATTR)
        last = self._seen.get(t._trial_id)
        if last is None or last[0] != value:
            self._seen[t._trial_id] = (value, now)
            return 0.0
        return now - last[1]

    def stale_ids(self, trials) -> set[int]:
        """`trials`: every RUNNING trial of other drivers; the ones no longer among them are forgotten."""
        ids = {t._trial_id for t in trials}
        self._seen = {i: v for i, v in self._seen.items() if i in ids}
        return {t._trial_id for t in trials if self.silent_for(t) > GRACE_PERIOD}


class Heartbeats:
    """Heartbeats from a thread of their own: the main loop can block for seconds (the
    forkserver's first start, a slow store), and a missed beat would make a live trial stale."""

    def __init__(self, storage, running: dict[int, Running]):
        self.storage = storage
        self.running = running  # the driver's own dict: trials come and go while the thread runs
        self._stop = threading.Event()

    def start(self) -> None:
        # (the gRPC storage proxy has no heartbeat API: `beat` writes the heartbeat attr instead)
        threading.Thread(target=self._loop, name="heartbeats", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL):
            for r in list(self.running.values()):
                try:
                    beat(self.storage, r)
                except Exception:
                    pass  # a transient store error; the next beat retries
                try:
                    if r.lost is None:
                        r.lost = lost_reason(self.storage, r)  # the driver's loop acts on it (events.py)
                except Exception:
                    pass  # read again after the next beat


def lost_reason(storage, r: Running) -> Lost | None:
    """Why this driver's trial `r` is no longer its own, or None: Optuna no longer has it RUNNING
    (another driver reaped it), or it is RUNNING but was put back to paused (put_back_reason)."""
    t = storage.get_trial(r.trial._trial_id)
    if t.state == TrialState.RUNNING:  # (put back, or put back and claimed by another worker: put_back_reason)
        return put_back_reason(t)
    by = t.system_attrs.get(REAPED)
    if by:
        return Lost(f"reaped by another worker ({by}) while it still ran here; its retry runs there")
    return Lost(f"Optuna has it {t.state.name} while it still ran here (another worker ended it)")


PUT_BACK = "put back to paused by another worker"


def put_back_reason(t) -> Lost | None:
    """Why this driver's RUNNING trial `t` is no longer its own: a trial scheduler's segment another
    worker took for dead and put back to paused (pauses.py), maybe claimed since by a third one."""
    info, owner = paused_mark(t), owner_of(t)
    if info is not None and info.get("interrupted"):
        return Lost(f"{PUT_BACK} (its heartbeats were stale); it resumes there", put_back=True)
    if owner is not None and owner.get("pid") is not None and (owner.get("host"), owner.get("pid")) != (this_host(), os.getpid()):
        return Lost(f"{PUT_BACK} and resumed by {describe(owner)}", put_back=True)
    return None


def dead_trials(study: optuna.Study, storage, mine: dict[int, Running], trials: list,
                watch: AttrBeats | None = None) -> tuple[list, list]:
    """Running trials of other drivers in `trials` that are dead: an owner on this host that is gone
    (at once), or no heartbeat for GRACE_PERIOD seconds (any host). Returns (the claimed ones: no run
    made, the claim takes them over in place, lifecycle.reclaim; the others, each with why it is dead).
    `mine`: the trials this driver runs (alive by definition). `watch`: the driver's AttrBeats, for a
    storage without Optuna heartbeats (the gRPC proxy). Reads the stale heartbeats only, when `trials`
    has a running trial of another driver."""
    others = [t for t in trials if t.state == TrialState.RUNNING and t.number not in mine]
    others = [t for t in others if state_of(t) in OWNED]  # (paused ones have no process: never dead)
    if not others:
        return [], []
    if not hasattr(storage, "record_heartbeat"):
        stale_ids = watch.stale_ids(others) if watch is not None else set()
    else:
        try:
            stale_ids = set(storage._get_stale_trial_ids(study._study_id))
        except Exception:
            stale_ids = set()
    claimed, dead = [], []
    for t in others:
        why = why_dead(t, stale_ids, storage)
        if why is None:
            continue
        if state_of(t) == State.CLAIMED:
            claimed.append(t)
        else:
            dead.append((t, why))
    return claimed, dead


def reap_dead_trials(
    study: optuna.Study,
    storage,
    mine: dict[int, Running],
    retry: RetryCopy,
    close_run: Callable[[str, TrialState, dict[str, str]], None],
    note: Callable[[str], None],
    guard: Callable[..., Any] = passthrough,
    watch: AttrBeats | None = None,
    put_back: Callable[[Any, str], bool] | None = None,
    trials: list | None = None,
) -> list:
    """Running trials of other drivers that are dead (dead_trials) -> FAIL, a WAITING retry copy, and
    their MLflow runs closed with the reason, so none stays RUNNING (lifecycle.reap). `guard`: the
    driver's store calls, retried through a database outage (outage.py), so a reap is not left half done.
    `put_back`: a trial scheduler's (driver/pauses.py): a dead segment becomes paused again in the same
    trial and run, no FAIL, no retry copy (False: max_interrupts reached, reaped as always).
    `trials`: the study's trials as the caller just read them (else read here).
    Returns the dead drivers' claimed trials (no run made): not reaped, the claim takes them over
    (lifecycle.reclaim)."""
    if trials is None:
        trials = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    claimed, dead = dead_trials(study, storage, mine, trials, watch)
    for t, why in dead:
        if put_back is None or not guard(put_back, t, why[1]):
            lifecycle.reap(study, storage, t, why, retry, close_run, note, guard)
    return claimed


def others_running(study: optuna.Study, storage, mine: dict[int, Running], watch: AttrBeats | None = None) -> list[str]:
    """RUNNING trials of other (live-looking) drivers, described with their owner and heartbeat age."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number in mine or state_of(t) not in OWNED:  # (a paused trial waits for a driver to resume it)
            continue
        if watch is not None and not hasattr(storage, "record_heartbeat"):
            age = watch.silent_for(t) if t.system_attrs.get(HEARTBEAT_ATTR) is not None else None
        else:
            age = heartbeat_age(storage, t._trial_id)
        beat_txt = f"last heartbeat {age:.0f} s ago" if age is not None else "no heartbeat yet"
        out.append(f"trial {t.number} ({describe(owner_of(t))}, {beat_txt})")
    return out
