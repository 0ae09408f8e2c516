"""Reading an embedded store's SQLite databases directly (optuna_sql.py, mlflow_sql.py): the file of a
`sqlite:///PATH` URL, and one read-only snapshot of it."""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from hpolab.stores.paths import sqlite_file


def sqlite_path(url: str) -> Path | None:
    """The database file of a `sqlite:///PATH[?QUERY]` URL (its query ignored); None for any other URL."""
    return sqlite_file(url)


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
