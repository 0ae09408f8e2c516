"""Riding out a temporary outage of a database store (PostgreSQL restarting, a failover, a network blip).

The driver's loop calls the Optuna storage all the time (ask, report, tell, heartbeats, counts); a
database that is briefly unreachable used to raise out of the loop and kill every running trial.
Instead, the few storage calls on the loop go through `StorageOutage.call`: an error that says the
database cannot be reached (a connection refused, reset or dropped: SQLAlchemy's OperationalError /
InterfaceError or an invalidated connection, whatever Optuna or MLflow wrapped it in) is retried
with exponential backoff (0.5 s doubling to 10 s) until `storage_outage_grace` seconds have passed
since the outage began. One line on stderr when it begins, one when the store answers again. Past
the grace the driver stops with one line (StudyError, exit 1); its trials stay resumable.

The clock is per outage, not per call: calls that fail one after another share it, and the first
call that goes through ends it. Once the grace is spent nothing is retried any more (the driver's
error path must not wait a second grace). Trial processes never touch a store (they talk to the
driver over a pipe): they keep training and wait for the driver's reply to their next epoch.

Only connection errors are retried: a constraint violation, a bad value or SQLite's own errors
(a locked or unreadable local file is not an outage that passes) raise as before.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")

FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 10.0


def unreachable(e: BaseException) -> BaseException | None:
    """The connection error behind `e` (itself, or in its cause/context chain), or None."""
    from sqlalchemy import exc

    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, exc.DBAPIError):
            orig = getattr(e, "orig", None)
            if type(orig).__module__.startswith("sqlite3"):
                return None  # a local file: locked or unreadable is not a server that comes back
            if e.connection_invalidated or isinstance(e, (exc.OperationalError, exc.InterfaceError)):
                return e
        elif isinstance(e, exc.DisconnectionError):
            return e
        elif type(e).__module__.split(".")[0] in ("psycopg2", "psycopg", "pymysql", "MySQLdb") and \
                type(e).__name__ in ("OperationalError", "InterfaceError"):
            return e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return None


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip()


class StorageOutage:
    """Retries calls while a store is unreachable, for up to `grace` seconds per outage."""

    def __init__(self, grace: float, what: str = "storage", aborting: Callable[[], bool] = lambda: False,
                 write: Callable[[str], None] | None = None):
        self.grace = grace
        self.what = what  # "storage" (Optuna) or "MLflow tracking store": named in the lines
        self.aborting = aborting  # a second Ctrl-C/SIGTERM: stop waiting at once
        self.write = write or (lambda line: print(f"hpolab: {line}", file=sys.stderr, flush=True))
        self.since: float | None = None  # when the current outage began (monotonic), None while reachable
        self.gave_up = False
        self.outages = 0  # how many began (for tests and the summary)
        self._lock = threading.Lock()  # the upload thread may share one with the loop

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        pause = FIRST_PAUSE_S
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as e:
                cause = unreachable(e)
                if cause is None or self.gave_up:
                    raise
                self._failed(cause)
                time.sleep(min(pause, self._left()))  # the last try falls at the end of the grace
                pause = min(pause * 2, MAX_PAUSE_S)
                continue
            self._reached()
            return result

    def _failed(self, cause: BaseException) -> None:
        from hpolab.errors import StudyError

        with self._lock:
            now = time.monotonic()
            if self.since is None:
                self.since, self.outages = now, self.outages + 1
                self.write(f"{self.what} unreachable ({first_line(cause)}); retrying for up to {self.grace:g} s "
                           f"(storage_outage_grace); running trials keep training")
            elapsed = now - self.since
            if elapsed < self.grace and not self.aborting():
                return
            self.gave_up = True
        raise StudyError(f"{self.what} unreachable for {elapsed:.0f} s (storage_outage_grace={self.grace:g}): "
                         f"{first_line(cause)}; the study's trials are resumable: re-run the same command once it is back") from None

    def _left(self) -> float:
        since = self.since
        return 0.0 if since is None else max(0.05, since + self.grace - time.monotonic())

    def _reached(self) -> None:
        if self.since is None:
            return
        with self._lock:
            if self.since is not None:
                self.write(f"{self.what} reachable again after {time.monotonic() - self.since:.1f} s; carrying on")
                self.since = None


def passthrough(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """The guard of code that is not on a driver's loop (tests, tools): just call."""
    return fn(*args, **kwargs)
