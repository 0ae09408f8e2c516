"""Heartbeats of the running trials, and the reaper of trials whose driver stopped beating.

Optuna's heartbeat marks a RUNNING trial as alive; a trial without one for GRACE_PERIOD seconds is
stale (its driver was killed or its machine lost). The reaper fails such trials, lets Optuna's retry
callback queue a WAITING copy, and closes their MLflow runs so none stays RUNNING forever.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Callable

import optuna
from optuna.trial import TrialState

from hpolab.stores.optuna_storage import GRACE_PERIOD, HEARTBEAT_INTERVAL
from hpolab.study.runner import Running

# We call Optuna's heartbeat API from an ask/tell driver on purpose (its built-in heartbeat only
# covers Study.optimize); its "experimental" and "use with optimize" warnings are noise here.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def beat(storage, r: Running, force: bool = False) -> None:
    """Record a heartbeat for `r` if one is due (or `force`)."""
    now = time.monotonic()
    if (force or now - r.last_heartbeat >= HEARTBEAT_INTERVAL) and hasattr(storage, "record_heartbeat"):
        storage.record_heartbeat(r.trial._trial_id)
        r.last_heartbeat = now


class Heartbeats:
    """Heartbeats from a thread of their own: the main loop can block for seconds (the
    forkserver's first start, a slow store), and a missed beat would make a live trial stale."""

    def __init__(self, storage, running: dict[int, Running]):
        self.storage = storage
        self.running = running  # the driver's own dict: trials come and go while the thread runs
        self._stop = threading.Event()

    def start(self) -> None:
        from optuna.storages._heartbeat import BaseHeartbeat

        if not isinstance(self.storage, BaseHeartbeat):
            return  # the gRPC storage proxy has no heartbeat API (see stores/grpc_proxy.py)
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


def reap_stale_trials(
    study: optuna.Study,
    mine: dict[int, Running],
    max_retries: int,
    close_run: Callable[[str, TrialState, dict[str, str]], None],
    note: Callable[[str], None],
) -> None:
    """Trials whose driver stopped heartbeating (killed, machine lost) -> FAIL, a WAITING retry
    copy (Optuna's callback), and their MLflow runs closed with the reason, so none stays RUNNING.
    `mine`: the trials this driver runs (alive by definition; never reaped here)."""
    before = {t.number for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING}
    optuna.storages.fail_stale_trials(study)
    trials = study.get_trials(deepcopy=False)
    for n in before:
        t = trials[n]
        if t.state != TrialState.FAIL or n in mine:
            continue
        retried_by = [w.number for w in trials if n in w.system_attrs.get("retry_history", []) and w.number != n]
        reason = f"its driver stopped sending heartbeats for {GRACE_PERIOD} s (killed or lost)"
        reason += f"; retried as trial {retried_by[0]}" if retried_by else f"; not retried (max_retries={max_retries} reached)"
        run_id = t.user_attrs.get("mlflow_run_id")
        if run_id:
            try:
                close_run(run_id, TrialState.FAIL, {"hpolab.fail_reason": reason, "hpolab.fail_kind": "stale"})
            except Exception as e:
                note(f"could not close the MLflow run of stale trial {n}: {e}")
        note(f"trial {n} was stale: {reason}")
