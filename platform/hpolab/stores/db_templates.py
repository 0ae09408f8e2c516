"""A new embedded store starts from migrated empty databases copied out of a per-version cache.

Creating MLflow's SQLite tracking DB runs some sixty alembic migrations, and Optuna's storage runs
its own: seconds of CPU, the largest fixed cost of the first `hpolab study run` in a new `--store`.
The result depends only on the installed versions, so the first new store on a machine pays it once,
into ~/.cache/hpolab (or $HPOLAB_CACHE), and every later new store copies the file (milliseconds).
The copy is written beside its target and renamed into place, never over an existing database, and
uses the write-ahead log (sqlite_wal.py).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Callable

from hpolab.stores.sqlite_wal import use_wal


def cache_dir() -> Path:
    if os.environ.get("HPOLAB_CACHE"):
        return Path(os.environ["HPOLAB_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hpolab"


def _template(key: str, create: Callable[[str], None]) -> Path:
    """The cached migrated empty DB for `key`, made by `create(sqlite_url)` the first time."""
    folder = cache_dir()
    path = folder / f"{key}.db"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{key}-", suffix=".db", dir=folder)
    os.close(fd)
    os.unlink(tmp)  # the creator wants to make the file itself
    try:
        create(f"sqlite:///{tmp}")
        os.replace(tmp, path)  # atomic: a concurrent creator's identical file may win, either is fine
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def seed_database(db: Path, key: str, create: Callable[[str], None],
                  prepare: Callable[[Path], None] | None = None) -> bool:
    """Put a migrated empty database at `db` if there is none (`prepare` adjusts the copy before it
    appears there); False where no copy could be made (an unwritable cache, say): the caller then
    creates the database itself, as before."""
    if db.exists():
        return True
    try:
        template = _template(key, create)
        fd, tmp = tempfile.mkstemp(prefix=f".{db.name}-", dir=db.parent)
        os.close(fd)
        try:
            shutil.copyfile(template, tmp)
            if prepare is not None:
                prepare(Path(tmp))
            use_wal(Path(tmp))
            os.link(tmp, db)  # fails if another worker created it meanwhile: theirs stays
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        return True
    except (OSError, sqlite3.Error):
        return False


def point_default_experiment(db: Path, location: str, now_ms: int) -> None:
    """MLflow's "Default" experiment (id 0) gets the artifact location and creation time a DB made
    for this store would have given it (not the template's temporary root and time)."""
    con = sqlite3.connect(db)
    try:
        with con:
            con.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ?"
                        " WHERE experiment_id = 0", (location, now_ms, now_ms))
    finally:
        con.close()
