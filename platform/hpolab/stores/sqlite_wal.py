"""An embedded store's SQLite databases use the write-ahead log (WAL).

A commit then appends to the log instead of writing a rollback journal and the database file: on
this machine's disk 0.37 against 2.4 ms per small commit, and a study makes hundreds (a trial's claim,
its run, each epoch's report). Readers do not wait for a writer. Every commit is still synced to disk
(synchronous stays FULL), so nothing committed is lost to a crash of the machine either.

The mode is kept in the database file, so every later connection uses the log: MLflow's server and
Optuna's storage included. A new store's databases are switched when they are made (db_templates.py),
and one made before is left as it is. WAL needs every process on one machine (no network filesystem),
which SQLite's locks needed already (docs/how-to/scaling-out.md).

Committed transactions sit in `optuna.db-wal` / `mlflow.db-wal` beside the database until they are
copied into it (a checkpoint). A process that opened a store checkpoints its databases when it exits,
so after a command the database file alone holds everything. A killed driver leaves its last commits
in the log; the next process that opens the database reads them (copy a store as a whole folder).
"""

from __future__ import annotations

import atexit
import sqlite3
from pathlib import Path

_at_exit: set[Path] = set()  # the databases this process checkpoints when it exits


def use_wal(db: Path) -> None:
    """Switch a database file nobody else has open yet to the write-ahead log (kept in the file)."""
    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA journal_mode=WAL")
    finally:
        con.close()


def checkpoint_at_exit(db: Path | None) -> None:
    """Copy `db`'s log into the database when this process exits (once per database; nothing for a
    database in another journal mode)."""
    if db is None or db in _at_exit:
        return
    if not _at_exit:
        atexit.register(_checkpoint_all)
    _at_exit.add(db)


def _checkpoint_all() -> None:
    for db in sorted(_at_exit):
        if not db.is_file():  # (connect would create it)
            continue
        try:
            con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=rw", uri=True, timeout=5)
            try:
                con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                con.close()
        except sqlite3.Error:
            pass  # (busy past the timeout: another process's writes; its own exit checkpoints them)
