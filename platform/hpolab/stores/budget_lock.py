"""A lock around "count the study's trials, then ask for one": exact budgets with any number of workers.

Without it two workers that count at the same instant both see one free slot and both ask, and the
study ends with n_trials + 1. The lock lives where the trials do:
- PostgreSQL: a session advisory lock keyed by the study name (`pg_advisory_lock`), held on its own
  pooled connection; any host that reaches the database takes part.
- SQLite: an exclusive `flock` on a file next to the database. SQLite is for one host, so an OS file
  lock is enough and never blocks readers of the database itself.
- Anything else (the gRPC proxy, MySQL): no lock; the caller falls back to the optimistic check
  (study/budget.py: `over_budget`). The context manager yields whether it holds a lock.
"""

from __future__ import annotations

import fcntl
import hashlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def _key(study_name: str) -> int:
    """A stable signed 64-bit key for pg_advisory_lock (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(f"hpolab-budget:{study_name}".encode()).digest()[:8], "big", signed=True)


@contextmanager
def budget_lock(storage, study_name: str) -> Iterator[bool]:
    engine = getattr(storage, "engine", None)
    if engine is None:
        yield False
        return
    url = engine.url
    if url.get_backend_name() == "postgresql":
        from sqlalchemy import text

        with storage.engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _key(study_name)})
            conn.commit()
            try:
                yield True
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _key(study_name)})
                conn.commit()
    elif url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        path = Path(url.database).with_suffix(".budget.lock")
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    else:
        yield False
