"""A lock around "count the study's trials, then ask for one": exact budgets with any number of workers.

Without it two workers that count at the same instant both see one free slot and both ask, and the
study ends with n_trials + 1. The lock lives where the trials do:
- PostgreSQL: a session advisory lock keyed by the study name (`pg_advisory_lock`), held on its own
  pooled connection; any host that reaches the database takes part.
- SQLite: an exclusive `flock` on a file next to the database. SQLite is for one host, so an OS file
  lock is enough and never blocks readers of the database itself.
- Anything else (the gRPC proxy, MySQL): no lock; the caller falls back to the optimistic check
  (study/state/budget.py: `over_budget`). The context manager yields whether it holds a lock.

Waiting is bounded (`timeout`, default LOCK_TIMEOUT seconds, env HPOLAB_LOCK_TIMEOUT): the lock is
tried without blocking (`pg_try_advisory_lock`, `LOCK_NB`) in a loop, so one hung holder (a worker
stopped in a debugger, a frozen host whose session the server keeps) ends the others' wait with a
clear error naming the lock, instead of stalling every worker's loop.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from hpolab.errors import StudyError

LOCK_TIMEOUT = float(os.environ.get("HPOLAB_LOCK_TIMEOUT", "120"))  # seconds a worker waits for the lock


def _key(study_name: str) -> int:
    """A stable signed 64-bit key for pg_advisory_lock (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(f"hpolab-budget:{study_name}".encode()).digest()[:8], "big", signed=True)


def _wait(try_once: Callable[[], bool], timeout: float, what: str) -> None:
    """Call try_once until it takes the lock; StudyError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    while not try_once():
        if time.monotonic() >= deadline:
            raise StudyError(f"timed out after {timeout:g} s waiting for {what}: another worker holds it and has not "
                             "let go (hung or stopped?); stop that worker, or raise HPOLAB_LOCK_TIMEOUT if its work is long")
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


@contextmanager
def budget_lock(storage, study_name: str, timeout: float | None = None) -> Iterator[bool]:
    timeout = LOCK_TIMEOUT if timeout is None else timeout
    engine = getattr(storage, "engine", None)
    if engine is None:
        yield False
        return
    url = engine.url
    if url.get_backend_name() == "postgresql":
        from sqlalchemy import text
        from sqlalchemy.exc import SQLAlchemyError

        key = _key(study_name)
        with storage.engine.connect() as conn:
            def try_once() -> bool:
                got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()
                conn.commit()
                return bool(got)

            _wait(try_once, timeout, f"the budget lock of study {study_name!r} (PostgreSQL advisory lock {key}; "
                                     f"its holder: SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)")
            try:
                yield True
            finally:
                try:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                    conn.commit()
                except SQLAlchemyError:
                    # Its session broke (the server restarted: study/state/outage.py). Closing it for good
                    # ends the session, and PostgreSQL drops a session's advisory locks with it: the
                    # lock is free, and the worker's ask() stands (raising here would ask again).
                    conn.invalidate()
    elif url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        path = Path(url.database).with_suffix(".budget.lock")
        with open(path, "a") as f:
            def try_flock() -> bool:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    return False

            _wait(try_flock, timeout, f"the budget lock of study {study_name!r} ({path}; its holder: fuser {path})")
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    else:
        yield False
