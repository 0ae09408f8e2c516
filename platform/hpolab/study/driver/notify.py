"""A study's notifications (the spec's `notify:`, config/notify.py): which events, their payloads, once per study.

The driver makes a Notifier once it has opened the study; the events come from the places that know
them: study_started (here, on opening), trial_failed and new_best (Progress.trial_finished, which every
trial end reaches), worker_lost (the reaper closing a dead driver's trial), study_finished or
study_error (the driver's end). `hpolab study set|pause|resume|stop` sends control_changed and
`hpolab promote` champion_changed themselves (`send_once`), to the targets the study's drivers
recorded (study user attr `hpolab.notify`: the spec's entries, ${VAR}s unexpanded).

Nothing here waits on the driver's loop: `emit` puts the event on a bounded queue; a thread of its own
claims it, reads what it needs from the stores and hands it to each target's Delivery
(notify_delivery.py: its own queue, thread, retries). A study event is sent once per study however
many workers run it: each claims it in the stores first (study system attr `hpolab.notified.<event>:<n>`,
written under the study's budget lock; through the gRPC proxy, which has no lock, the claim is read back
after CLAIM_SETTLE_S and the last writer sends). `n` counts the study's ends (`hpolab.notify_session`),
so a study run again after it finished is started and finished anew. Trial events happen in one
driver only. A dropped notification is counted in `hpolab.notify_dropped.<host>:<pid>` (`study status`
shows the sum). At its end the driver waits at most EXIT_WAIT_S for the deliveries still queued.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
import uuid
from typing import Any, Callable

from hpolab.config.notify import NotifyTarget
from hpolab.stores.budget_lock import budget_lock
from hpolab.stores.control import now_iso
from hpolab.stores.paths import Stores, server_ui_url
from hpolab.study.driver import notify_text
from hpolab.study.driver.notify_delivery import QUEUE_SIZE, Delivery
from hpolab.study.state.owners import this_host

NOTIFY_ATTR = "hpolab.notify"
SESSION_ATTR = "hpolab.notify_session"
CLAIM_PREFIX = "hpolab.notified."
DROPPED_PREFIX = "hpolab.notify_dropped."
CLAIM_SETTLE_S = 2.0  # a claim without a lock (the gRPC proxy): read back after the others wrote theirs
EXIT_WAIT_S = float(os.environ.get("HPOLAB_NOTIFY_EXIT_WAIT", "10"))  # seconds a driver's end waits for deliveries


class Notifier:
    """The driver's notifications. Without targets every method returns at once."""

    def __init__(self, spec, stores: Stores, storage, study_id: int, note: Callable[[str], None], experiment_id: str | None = None,
                 client=None):
        self.spec, self.stores, self.storage, self.study_id = spec, stores, storage, study_id
        self.note, self.experiment_id, self.client = note, experiment_id, client
        self.worker = f"{this_host()} pid {os.getpid()}"
        self.session = 0  # the study's end count when this driver started: its claims' n
        self.dropped, self._lock = 0, threading.Lock()
        self.t0 = time.monotonic()
        storage.set_study_user_attr(study_id, NOTIFY_ATTR, [t.model_dump(mode="json") for t in spec.notify])
        self.deliveries = [Delivery(t, i, self._drop) for i, t in enumerate(spec.notify)]
        if self.deliveries:
            self.session = int(storage.get_study_system_attrs(study_id).get(SESSION_ATTR, 0))
        for i, t in enumerate(spec.notify):
            missing = [v for v in t.variables() if v not in os.environ]
            if missing:
                note(f"{t.describe(i)}: {', '.join(missing)} not set in the environment: its notifications will be dropped")
        self.inbox: queue.Queue = queue.Queue(maxsize=QUEUE_SIZE)
        self._thread = None
        if self.deliveries:
            self._thread = threading.Thread(target=self._loop, name="notify", daemon=True)
            self._thread.start()
        self.emit("study_started", lambda: {"n_trials": spec.n_trials, "parallel": spec.parallel}, claim="study_started")

    # ---------------------------------------------------------------- what the driver calls

    def emit(self, event: str, fields: Callable[[], dict[str, Any] | None], claim: str | None = None) -> None:
        """Queue `event` without waiting. `fields()` runs on the notifier's thread (it may read the
        stores; None: nothing to send); `claim`: a study event, sent by one driver only."""
        if not any(d.wants(event) for d in self.deliveries):
            return
        try:
            self.inbox.put_nowait((event, fields, claim))
        except queue.Full:
            self._drop("notify", f"{event}: the notification queue of {QUEUE_SIZE} is full")

    def trial_finished(self, number: int, state: str, reason: str | None, trial, output: list[str]) -> None:
        """Progress.trial_finished's listener: trial_failed (with the last lines the trial printed and
        of its traceback), and new_best when it is the study's best."""
        run_id = trial.user_attrs.get("mlflow_run_id") if trial is not None else None
        if state == "FAIL":
            self.emit("trial_failed", lambda: {"trial": number, "reason": reason, "run_id": run_id, "run_link": self._run_link(run_id),
                                               "output_tail": list(output), "log_tail": self._log_tail(run_id)})
        elif state == "COMPLETE":
            self.emit("new_best", lambda: self._new_best(number, run_id))

    def watch_reaps(self, close: Callable[..., None]) -> Callable[..., None]:
        """The reaper's close of a dead driver's trial run, sending worker_lost first."""
        def closing(run_id: str, state, tags: dict[str, str]) -> None:
            self.emit("worker_lost", lambda: {"run_id": run_id, "trial": self._trial_of(run_id), "reason": tags.get("hpolab.fail_reason"),
                                              "run_link": self._run_link(run_id)})
            close(run_id, state, tags)

        return closing

    def ended(self, outcome) -> None:
        """The driver's end: study_finished (the study reached its end, or a stop) or study_error; nothing
        after Ctrl-C / SIGTERM (resumable); then wait for the deliveries (at most EXIT_WAIT_S)."""
        c = outcome.counts
        done = c.get("finished", 0) >= outcome.n_trials or outcome.budget_spent or outcome.stopped or outcome.halted or outcome.timed_out
        if outcome.signal is None and done and not outcome.failure_limit:
            reason = (outcome.halted or outcome.stopped or ("timeout reached" if outcome.timed_out and c.get("finished", 0) < outcome.n_trials
                                                              else f"{c.get('finished', 0)}/{outcome.n_trials} trials finished"))
            self.emit("study_finished", lambda: self._summary(reason, c), claim="study_finished")
        elif outcome.signal is None:
            why = outcome.failure_limit or f"the study stopped with {c.get('finished', 0)}/{outcome.n_trials} trials finished"
            self.error(why)
        self.close(wait=None if outcome.signal is None else min(EXIT_WAIT_S, 2.0))  # (after Ctrl-C: hardly a wait)

    def driver_failed(self, e: BaseException) -> None:
        """The driver stopped on an error: study_error (a KeyboardInterrupt is none), then close."""
        if isinstance(e, Exception):
            self.error(f"{type(e).__name__}: {e}")
        self.close()

    def error(self, why: str) -> None:
        digest = hashlib.sha256(why.encode()).hexdigest()[:8]  # the same error on every worker: once
        self.emit("study_error", lambda: {"error": why, "trials": self._counts()}, claim=f"study_error:{digest}")

    def close(self, wait: float | None = None) -> None:
        """Wait (at most `wait`, default EXIT_WAIT_S, for all of them together) for what is queued; the rest is dropped."""
        if self._thread is None:
            return
        deadline = time.monotonic() + (EXIT_WAIT_S if wait is None else wait)
        try:
            self.inbox.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        left = sum(d.close(deadline) for d in self.deliveries) + (self.inbox.qsize() if self._thread.is_alive() else 0)
        self._thread = None
        if left:
            self._drop("notify", f"{left} not delivered in the {EXIT_WAIT_S:g} s a driver waits at its end "
                                 "(HPOLAB_NOTIFY_EXIT_WAIT)", count=left)

    # ---------------------------------------------------------------- the notifier's thread

    def _loop(self) -> None:
        while True:
            item = self.inbox.get()
            if item is None:
                return
            event, fields, claim = item
            try:
                if claim is not None and not self._claim(claim):
                    continue
                values = fields()
            except Exception as e:  # a store read failed: the event goes out with what is known
                values = {"note": f"details unavailable: {type(e).__name__}"}
            if values is None:
                continue
            payload = self._payload(event, values, claim)
            for d in self.deliveries:
                if d.wants(event):
                    d.submit(payload)

    def _claim(self, what: str) -> bool:
        """True when this driver sends study event `what` (nobody else has)."""
        mine = {"by": self.worker, "at": now_iso(), "nonce": uuid.uuid4().hex}
        with budget_lock(self.storage, self.spec.name) as locked:
            attrs = self.storage.get_study_system_attrs(self.study_id)
            key = f"{CLAIM_PREFIX}{what}:{self.session}"
            if key in attrs:
                return False
            self.storage.set_study_system_attr(self.study_id, key, mine)
            if what == "study_finished":  # a later run of the study starts and finishes anew
                self.storage.set_study_system_attr(self.study_id, SESSION_ATTR, self.session + 1)
        if locked:
            return True
        time.sleep(CLAIM_SETTLE_S)
        return (self.storage.get_study_system_attrs(self.study_id).get(key) or {}).get("nonce") == mine["nonce"]

    def _payload(self, event: str, values: dict[str, Any], claim: str | None) -> dict[str, Any]:
        ident = f"{self.spec.name}:{claim}:{self.session}" if claim else uuid.uuid4().hex
        payload = {"event": event, "id": ident, "study": self.spec.name, "time": now_iso(), "worker": self.worker,
                   "links": self._links(), **values}
        payload["text"] = notify_text.line(payload)
        return payload

    def _links(self) -> dict[str, Any]:
        ui = server_ui_url(self.stores.tracking_uri)
        return {"mlflow_experiment": f"{ui}/#/experiments/{self.experiment_id}" if ui and self.experiment_id else None,
                "tracking_uri": self.stores.tracking_shown, "optuna_storage": self.stores.optuna_shown,
                "ui_command": None if ui else f"hpolab --store {self.stores.root} ui"}

    def _run_link(self, run_id: str | None) -> str | None:
        ui = server_ui_url(self.stores.tracking_uri)
        return f"{ui}/#/experiments/{self.experiment_id}/runs/{run_id}" if ui and run_id and self.experiment_id else None

    def _drop(self, name: str, why: str, count: int = 1) -> None:
        with self._lock:
            self.dropped += count
            total = self.dropped
        self.note(f"{name}: {why} (dropped; {total} so far)")
        try:
            self.storage.set_study_system_attr(self.study_id, f"{DROPPED_PREFIX}{this_host()}:{os.getpid()}",
                                               {"count": total, "last": f"{name}: {why}", "at": now_iso()})
        except Exception:
            pass  # the count is in the driver's output; a store that fails now is the driver's to say

    # ---------------------------------------------------------------- reading what an event needs

    def _completed(self):
        from optuna.trial import TrialState

        return self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.COMPLETE,))

    def _new_best(self, number: int, run_id: str | None) -> dict[str, Any] | None:
        return notify_text.new_best(self._completed(), self.spec, number, run_id, self._run_link(run_id))

    def _summary(self, reason: str, counts: dict[str, int]) -> dict[str, Any]:
        best = notify_text.best_of(self._completed(), self.spec)
        if best is not None:
            best["run_link"] = self._run_link(best.get("run_id"))
        return {"reason": reason, "trials": counts, "n_trials": self.spec.n_trials, "best": best,
                "elapsed_s": round(time.monotonic() - self.t0, 1)}

    def _counts(self) -> dict[str, int]:
        from hpolab.stores.trial_counts import count_trials

        return count_trials(self.storage.get_all_trials(self.study_id, deepcopy=False))

    def _trial_of(self, run_id: str) -> int | None:
        if self.client is None:
            return None
        name = self.client.get_run(run_id).info.run_name or ""
        return int(name.split("-")[-1]) if name.startswith("trial-") and name.split("-")[-1].isdigit() else None

    def _log_tail(self, run_id: str | None, lines: int = 15) -> list[str]:
        """The last lines of the traceback the trial sent (traceback.txt of its run, once closed)."""
        return notify_text.log_tail(self.client, run_id, lines) if self.client is not None and run_id else []


def send_once(name: str, stores: Stores, user_attrs: dict[str, Any], event: str, values: dict[str, Any], storage=None,
              study_id: int | None = None) -> None:
    """A command's event (control_changed, champion_changed) to the targets the study's drivers recorded,
    at once; waits at most EXIT_WAIT_S. A target that did not get it is said on stderr (and counted)."""
    import sys

    targets = [NotifyTarget.model_validate(t) for t in user_attrs.get(NOTIFY_ATTR) or []]
    dropped: list[str] = []
    deliveries = [Delivery(t, i, lambda n, why: dropped.append(f"{n}: {why}")) for i, t in enumerate(targets) if event in t.events]
    if not deliveries:
        return
    payload = {"event": event, "id": uuid.uuid4().hex, "study": name, "time": now_iso(), "worker": f"{this_host()} pid {os.getpid()}",
               "links": {"tracking_uri": stores.tracking_shown, "optuna_storage": stores.optuna_shown}, **values}
    payload["text"] = notify_text.line(payload)
    for d in deliveries:
        d.submit(payload)
    deadline = time.monotonic() + EXIT_WAIT_S
    left = sum(d.close(deadline) for d in deliveries)
    for why in dropped + ([f"notify: {left} not delivered in {EXIT_WAIT_S:g} s"] if left else []):
        print(f"hpolab: {why} (dropped)", file=sys.stderr)
    if (dropped or left) and storage is not None and study_id is not None:
        key = f"{DROPPED_PREFIX}{this_host()}:{os.getpid()}"
        storage.set_study_system_attr(study_id, key, {"count": len(dropped) + left, "last": (dropped or ["not delivered in time"])[-1],
                                                      "at": now_iso()})
