"""Which worker runs the study's LR range test, where no lock can be taken (Optuna's gRPC storage proxy).

On SQLite and PostgreSQL the test runs under the study's budget lock (stores/budget_lock.py). Through
the proxy there is no lock, and a study attr is last-writer-wins, so workers started together would
each run the test and overwrite each other's bounds. What every Optuna storage does guarantee is that
trial numbers are handed out in one total order (RDBStorage creates a trial with the study row locked;
the proxy forwards to it). So each worker takes a ticket: a claim trial, created already finished
(FAIL, marked `hpolab.released`, so it counts nowhere, is never reaped and is never sampled from),
with its owner record in the system attr `hpolab.lr_test_claim`. The worker holding the lowest-numbered
live ticket runs the test; the others wait until the study has its result.

A ticket is live while its holder beats: the study system attr `hpolab.lr_test_claim.<number>` is
{"beat": the holder's time.time(), "ended": None | why it left}, rewritten every HEARTBEAT_INTERVAL
seconds by that holder only (one writer per key). A ticket stops being live when it says it ended
(the holder recorded the result, failed, or was interrupted), when its holder ran on this host and is
gone (owners.py, at once), or when its attr has not changed for GRACE_PERIOD seconds of the reader's
own clock (any host: clocks are never compared, as in heartbeat.py's AttrBeats). The next ticket then
takes over. A holder that was only stalled past the grace period may still finish its test: it then
finds the result recorded and does not overwrite it (a narrow race remains between that check and the
write; both results are valid tests of the same spec).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator

import optuna
from optuna.trial import TrialState

from hpolab.errors import StudyError
from hpolab.stores.optuna_storage import GRACE_PERIOD, HEARTBEAT_INTERVAL
from hpolab.stores.trial_states import RELEASED
from hpolab.study.state.owners import describe, owner_gone, owner_record

CLAIM = "hpolab.lr_test_claim"  # trial system attr: the ticket holder's owner record
POLL = 0.5  # seconds between looks at the study while waiting


def _state_key(number: int) -> str:
    return f"{CLAIM}.{number}"


class LRTestClaim:
    """This worker's ticket for running the study's LR range test (see the module doc)."""

    def __init__(self, study: optuna.Study):
        self.study = study
        self.storage = study._storage
        self.number: int | None = None
        self._last_beat = 0.0
        self._seen: dict[int, tuple[Any, float]] = {}  # ticket -> (its last state seen, our monotonic time it changed)

    def take(self) -> int:
        """Create this worker's ticket; its number places it in the queue."""
        template = optuna.create_trial(state=TrialState.FAIL,
                                       system_attrs={RELEASED: True, CLAIM: owner_record(-1)})
        trial_id = self.storage.create_new_trial(self.study._study_id, template_trial=template)
        self.number = self.storage.get_trial(trial_id).number
        self.beat(force=True)
        return self.number

    def beat(self, force: bool = False) -> None:
        """Say this ticket is live (every HEARTBEAT_INTERVAL seconds, or now with `force`)."""
        if self.number is None or not (force or time.monotonic() - self._last_beat >= HEARTBEAT_INTERVAL):
            return
        try:
            self.storage.set_study_system_attr(self.study._study_id, _state_key(self.number), {"beat": time.time(), "ended": None})
        except Exception:
            return  # a transient store error: the next beat retries (a grace period is several beats)
        self._last_beat = time.monotonic()

    @contextlib.contextmanager
    def beating(self) -> Iterator[None]:
        """Beat from a thread of its own while the body runs: the whole of the holder's turn (the test's
        process, and then its MLflow run, plot and study attr, which on a busy machine or a slow server
        can take longer than the grace period), not only while something calls beat()."""
        stop = threading.Event()
        thread = threading.Thread(target=lambda: [self.beat() for _ in iter(lambda: stop.wait(0.5), True)],
                                  name="hpolab-lr-claim-beat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def end(self, why: str) -> None:
        """This worker leaves the queue (result recorded, test failed, interrupted): the next ticket goes on."""
        if self.number is not None:
            self.storage.set_study_system_attr(self.study._study_id, _state_key(self.number), {"beat": time.time(), "ended": why})

    def _dead(self, ticket, states: dict[str, Any]) -> bool:
        """Whether another worker's ticket is no longer live (ended, owner gone, or silent past the grace period)."""
        state = states.get(_state_key(ticket.number))
        if isinstance(state, dict) and state.get("ended"):
            return True
        if owner_gone(ticket.system_attrs.get(CLAIM)):
            return True
        now, last = time.monotonic(), self._seen.get(ticket.number)
        if last is None or last[0] != state:
            self._seen[ticket.number] = (state, now)  # first seen, or it changed: its grace starts now
            return False
        return now - last[1] > GRACE_PERIOD

    def ahead(self) -> list:
        """The live tickets numbered below this worker's, lowest first."""
        states = self.storage.get_study_system_attrs(self.study._study_id)
        tickets = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
                   if t.number < self.number and t.system_attrs.get(CLAIM)]
        return [t for t in tickets if not self._dead(t, states)]

    def wait_for_turn(self, recorded: Callable[[], bool], timeout: float, aborting: Callable[[], bool]) -> bool:
        """Wait until this worker runs the test (True) or another worker's result is recorded (False).
        StudyError after `timeout` seconds of waiting for a live ticket ahead."""
        deadline = time.monotonic() + timeout
        while not recorded():
            ahead = self.ahead()
            if not ahead:
                # The holder ahead records its result before it ends its ticket, so a ticket seen ended
                # after the look above may have left a result that look missed: look once more.
                return not recorded()
            if aborting():
                return False
            if time.monotonic() > deadline:
                holder = ahead[0]
                raise StudyError(
                    f"timed out after {timeout:g} s waiting for the LR range test of study {self.study.study_name!r} that "
                    f"{describe(holder.system_attrs.get(CLAIM))} runs (claim trial {holder.number}); it is still alive. "
                    "Stop that worker, or raise HPOLAB_LR_TEST_LOCK_TIMEOUT if its test is long")
            self.beat()
            time.sleep(POLL)
        return False
