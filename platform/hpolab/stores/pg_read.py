"""Reading a PostgreSQL database directly, read-only, for the plain-SQL readers (optuna_sql.py): the same
queries they run on an embedded store's SQLite file, through psycopg2 without SQLAlchemy or Optuna.

Opening Optuna's RDBStorage on PostgreSQL (Optuna, SQLAlchemy's ORM, the schema check) and reading
1,000 trials through it costs about 2 s before `study status` prints a row; psycopg2 costs 0.05 s to
import and one round trip per query. The connection is opened with the URL the user gave for the
Optuna storage, in a READ ONLY, REPEATABLE READ transaction (every query sees one snapshot, nothing can
be written), named `hpolab-read` in pg_stat_activity, and closed at once: a read holds one connection
for well under a second. Any other URL, a driver other than psycopg2, or a connection that fails gives
None, and the caller reads through Optuna, which says what is wrong in one line.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from typing import Any, Callable, Iterator
from urllib.parse import parse_qsl, unquote

CONNECT_TIMEOUT_S = int(os.environ.get("HPOLAB_STORE_CONNECT_TIMEOUT", "5"))  # as preflight.py bounds a connect
# SQLAlchemy's own URL pattern (sqlalchemy/engine/url.py _parse_url), so a URL means here what it means to Optuna
_URL = re.compile(r"""
    (?P<name>[\w\+]+)://
    (?:(?P<username>[^:/]*)(?::(?P<password>[^@]*))?@)?
    (?:(?:\[(?P<ipv6host>[^/\?]+)\]|(?P<ipv4host>[^/:\?]+))?(?::(?P<port>[^/\?]*))?)?
    (?:/(?P<database>[^\?]*))?
    (?:\?(?P<query>.*))?
    """, re.X)


def is_postgres(url: str) -> bool:
    """A PostgreSQL URL that SQLAlchemy opens with psycopg2 (its default PostgreSQL driver)."""
    return url.split("://", 1)[0] in ("postgresql", "postgresql+psycopg2", "postgres")


def connect_kwargs(url: str) -> dict[str, Any] | None:
    """psycopg2.connect's keywords for a SQLAlchemy PostgreSQL URL (None: not one this reader opens)."""
    m = _URL.match(url)
    if m is None or not is_postgres(url):
        return None
    c = m.groupdict()
    kw: dict[str, Any] = {"dbname": unquote(c["database"]) if c["database"] else None,
                          "user": unquote(c["username"]) if c["username"] else None,
                          "password": unquote(c["password"]) if c["password"] is not None else None,
                          "host": c["ipv4host"] or c["ipv6host"], "port": int(c["port"]) if c["port"] else None,
                          "connect_timeout": CONNECT_TIMEOUT_S, "application_name": "hpolab-read"}
    kw.update(parse_qsl(c["query"] or ""))  # libpq's own settings (sslmode, connect_timeout, ...) as SQLAlchemy passes them
    return {k: v for k, v in kw.items() if v is not None}


def reachable(url: str) -> bool:
    """True when `url` is one this module opens and its server lets us in (a pre-flight check without
    SQLAlchemy); False otherwise (the caller checks it the long way and says why)."""
    kw = connect_kwargs(url)
    if kw is None:
        return False
    try:
        import psycopg2
    except ImportError:
        return False
    try:
        psycopg2.connect(**kw).close()
    except psycopg2.Error:
        return False
    return True


class ReadError(Exception):
    """A query on PostgreSQL failed (psycopg2's error, wrapped so that a reader can catch it without importing psycopg2)."""


class Connection:
    """The part of sqlite3.Connection the readers use (execute -> an iterable cursor), on psycopg2: their
    `?` placeholders become psycopg2's `%s` (and a literal `%` is doubled)."""

    def __init__(self, con) -> None:
        self._con = con

    def execute(self, sql: str, params: tuple | list = ()):
        cur = self._con.cursor()
        cur.execute(sql.replace("%", "%%").replace("?", "%s"), tuple(params))
        return cur


@contextmanager
def snapshot(url: str, readable: Callable[[Connection], bool]) -> Iterator[Connection | None]:
    """A read-only connection inside one REPEATABLE READ transaction (one snapshot for every query);
    None when the URL is not one this opens, the server cannot be reached, or `readable(con)` says the
    reader does not know the schema."""
    kw = connect_kwargs(url)
    if kw is None:
        yield None
        return
    import psycopg2

    try:
        raw = psycopg2.connect(**kw)
    except psycopg2.Error:
        yield None
        return
    try:
        raw.set_session(readonly=True, isolation_level="REPEATABLE READ")
        con = Connection(raw)
        try:
            ok = readable(con)
        except psycopg2.Error:
            ok = False
        try:
            yield con if ok else None
        except psycopg2.Error as e:
            raise ReadError(str(e)) from e
    finally:
        raw.close()
