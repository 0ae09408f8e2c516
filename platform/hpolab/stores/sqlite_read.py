"""Reading an embedded store's SQLite databases directly (optuna_sql.py, mlflow_sql.py): one read-only
snapshot of a database file (the file of a `sqlite:///PATH` URL: paths.sqlite_file)."""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


@contextmanager
def snapshot(path: Path, readable: Callable[[sqlite3.Connection], bool]) -> Iterator[sqlite3.Connection | None]:
    """A read-only connection (never creates or migrates a file) inside one transaction, so every
    query sees the same snapshot; None when the file is missing or `readable(con)` says this reader
    does not know its schema."""
    if not Path(path).is_file():
        yield None
        return
    try:
        con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        yield None
        return
    try:
        con.execute("BEGIN")
        yield con if readable(con) else None
    finally:
        con.close()


def has_columns(columns: dict[str, set[str]]) -> Callable[[sqlite3.Connection], bool]:
    """A `readable` check for snapshot(): every table has the columns a reader reads from it."""
    def readable(con: sqlite3.Connection) -> bool:
        return all(cols <= {row[1] for row in con.execute(f"PRAGMA table_info({table})")} for table, cols in columns.items())
    return readable
