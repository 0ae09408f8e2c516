"""Pre-flight check of the stores: one clear line, within seconds, before a command opens them.

Without it a wrong or down store surfaces deep inside Optuna/SQLAlchemy/MLflow as a traceback after
retries (MLflow's HTTP client retries for minutes by default). Here each store is opened once with
bounded waits: a malformed URL or a missing driver package is bad input (UserError, exit 2); a
well-formed URL whose server does not answer is StoreUnreachable (exit 1). Every message names the
URL with its password redacted and the fix.

Local SQLite stores cost nothing here (no connection is opened and MLflow is not imported).
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path

from hpolab.errors import StoreUnreachable, UserError
from hpolab.stores.paths import Stores, redact

CONNECT_TIMEOUT_S = int(os.environ.get("HPOLAB_STORE_CONNECT_TIMEOUT", "5"))  # per database connect
HTTP_TIMEOUT_S = int(os.environ.get("HPOLAB_STORE_HTTP_TIMEOUT", "5"))  # the one pre-flight request to an MLflow server

OPTUNA_FIX = "check --storage / OPTUNA_STORAGE"
TRACKING_FIX = "check --tracking-uri / MLFLOW_TRACKING_URI"
DB_EXAMPLES = "sqlite:///PATH/optuna.db or postgresql+psycopg2://USER:PASSWORD@HOST:5432/DB"

# The pip package behind each SQLAlchemy driver a user is likely to name.
DRIVER_PACKAGES = {
    "psycopg2": "psycopg2-binary",
    "psycopg": "'psycopg[binary]'",
    "pg8000": "pg8000",
    "asyncpg": "asyncpg",
    "mysqldb": "mysqlclient",
    "pymysql": "pymysql",
    "mysqlconnector": "mysql-connector-python",
    "mariadbconnector": "mariadb",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
    "oracledb": "oracledb",
    "cx_oracle": "cx_Oracle",
}

# Words in a server's refusal that mean "your URL/credentials are wrong", not "the server is down".
_USER_FAULTS = ("authentication failed", "access denied", "does not exist", "no password supplied", "unknown database",
                "password authentication", "invalid password", "not permitted to log in")


def check_stores(stores: Stores, optuna: bool = True, tracking: bool = True, create: bool = True) -> None:
    """Raise UserError / StoreUnreachable (one line) if a store the command needs cannot be used.
    `create` False: a command that reads (status, compare, promote, predict, ui ...): an embedded
    store's database file must exist already (opening it would create an empty one)."""
    if optuna:
        if stores.optuna_kind == "grpc":
            from hpolab.stores.grpc_proxy import grpc_storage

            grpc_storage(stores.optuna_url).close()  # bounded wait for the proxy, one line when it is not there
        else:
            check_database(stores.optuna_url, "Optuna storage", OPTUNA_FIX, stores.root, shown=stores.optuna_shown)
    if tracking:
        check_tracking(stores.tracking_uri, stores.root, shown=stores.tracking_shown)
    if not create:  # (after the checks of both URLs: a malformed one is said first)
        require_existing(stores, optuna, tracking)


def require_existing(stores: Stores, optuna: bool = True, tracking: bool = True) -> None:
    """UserError when an embedded store's database a reading command opens does not exist: opening it
    would create an empty one, and the study is elsewhere."""
    for db, what, used in ((stores.optuna_db, "Optuna storage", optuna), (stores.tracking_db, "MLflow tracking store", tracking)):
        if used and db is not None and not db.exists():
            raise UserError(f"no {what} at {db}: nothing has run with this store; run a study first, or give the --store "
                            "(or --storage / --tracking-uri) the study ran with")


def connect_args_for(url) -> dict:
    """Bounded connect waits for the drivers that take one (a URL's own ?connect_timeout= wins)."""
    from sqlalchemy.engine import make_url

    u = make_url(url) if isinstance(url, str) else url
    if u.get_backend_name() in ("postgresql", "mysql") and u.get_driver_name() in ("psycopg2", "psycopg", "mysqldb", "pymysql"):
        if "connect_timeout" not in u.query:
            return {"connect_timeout": CONNECT_TIMEOUT_S}
    return {}


def parse_database_url(url: str, what: str, fix: str, shown: str | None = None):
    """The SQLAlchemy URL and its dialect class, or UserError naming the fix (exit 2)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shown = redact(url) if shown is None else shown
    try:
        u = make_url(url)
    except (ArgumentError, ValueError) as e:
        raise UserError(f"{what} {shown!r} is not a database URL ({one_line(e)}); {fix}: e.g. {DB_EXAMPLES}") from None
    try:
        dialect = u.get_dialect()
    except NoSuchModuleError:
        raise UserError(f"{what} {shown!r}: no database dialect {u.drivername!r} (SQLAlchemy knows sqlite, postgresql, mysql, "
                        f"mssql, oracle); {fix}: e.g. {DB_EXAMPLES}") from None
    try:
        dialect.import_dbapi() if hasattr(dialect, "import_dbapi") else dialect.dbapi()
    except ImportError as e:
        driver = u.get_driver_name()
        package = DRIVER_PACKAGES.get(driver, f"the package that provides {e.name or driver!r}")
        raise UserError(f"{what} {shown!r} needs the Python driver {driver!r}, which is not installed ({one_line(e)}): "
                        f"pip install {package} into this environment, or name an installed driver in the URL "
                        f"(e.g. postgresql+psycopg2://)") from None
    return u, dialect


def check_database(url: str, what: str, fix: str, root: Path | None = None, shown: str | None = None) -> None:
    """`shown`: the URL redacted (Stores.optuna_shown), when the caller has it already."""
    shown = redact(url) if shown is None else shown
    if url.startswith("sqlite:///") and not any(c in url for c in "?#%"):
        # A plain SQLite file URL (the store's default) always parses and its driver is the standard
        # library's: no SQLAlchemy import (a second on a loaded machine) to learn what we know.
        _check_sqlite_folder(url[len("sqlite:///"):], what, shown, fix, root)
        return
    from hpolab.stores.pg_read import reachable

    if reachable(url):  # a psycopg2 PostgreSQL URL that answers: no SQLAlchemy import (its failures are said below)
        return
    u, _ = parse_database_url(url, what, fix, shown)
    if u.get_backend_name() == "sqlite":
        _check_sqlite_folder(u.database, what, shown, fix, root)
        return
    from sqlalchemy import create_engine
    from sqlalchemy.exc import DBAPIError, SQLAlchemyError
    from sqlalchemy.pool import NullPool

    engine = create_engine(u, poolclass=NullPool, connect_args=connect_args_for(u))
    try:
        with engine.connect():
            pass
    except DBAPIError as e:
        raise _refused(what, shown, fix, one_line(e.orig if e.orig is not None else e)) from None
    except SQLAlchemyError as e:
        raise StoreUnreachable(f"cannot open the {what} {shown} ({one_line(e)}); {fix}") from None
    finally:
        engine.dispose()


def _check_sqlite_folder(db: str | None, what: str, shown: str, fix: str, root: Path | None) -> None:
    if db and db != ":memory:" and not db.startswith("file:"):
        folder = Path(db).expanduser().resolve().parent
        # The store folder itself is created by the commands that write (ensure_local).
        if not folder.is_dir() and (root is None or folder != Path(root).resolve()):
            raise UserError(f"{what} {shown!r}: folder {folder} does not exist; create it or {fix}")


def _refused(what: str, shown: str, fix: str, reason: str) -> Exception:
    if any(w in reason.lower() for w in _USER_FAULTS):
        return UserError(f"the {what} {shown} refused us ({reason}); fix the user, password or database name in the URL ({fix})")
    return StoreUnreachable(f"cannot reach the {what} {shown} ({reason}); is the database server running and are host "
                            f"and port right? ({fix})")


@contextmanager
def _mlflow_http_bounded():
    """MLflow's HTTP client, for the pre-flight request only: no retries, a short timeout.

    (Its defaults -- 7 retries with exponential backoff, 120 s timeout -- suit a long study riding out
    a server restart, so they are restored afterwards.)"""
    names = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(HTTP_TIMEOUT_S)}
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_tracking(uri: str, root: Path | None = None, shown: str | None = None) -> None:
    shown = redact(uri) if shown is None else shown
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme in ("", "file"):
        return  # a local folder (MLflow's file store): created on first write
    if scheme.split("+")[0] in ("sqlite", "postgresql", "mysql", "mssql", "oracle"):
        check_database(uri, "MLflow tracking store", TRACKING_FIX, root, shown=shown)
        return
    if scheme in ("http", "https"):
        _check_mlflow_server(uri, shown)
        return
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry  # plugins may add schemes

        _tracking_store_registry.get_store_builder(uri)
    except Exception:
        raise UserError(f"MLflow tracking URI {shown!r}: MLflow has no tracking store for scheme {scheme!r}; {TRACKING_FIX}: "
                        "e.g. http://HOST:5000 or sqlite:///PATH/mlflow.db") from None


def _check_mlflow_server(uri: str, shown: str) -> None:
    from hpolab.stores.mlflow_rest import reachable

    if reachable(uri, HTTP_TIMEOUT_S):  # one request without importing MLflow (1.7 s); a failure is said through its client below
        return
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from hpolab.stores.mlflow_runs import quiet_mlflow

    quiet_mlflow()
    with _mlflow_http_bounded():
        try:
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except MlflowException as e:
            reason = one_line(e.message if hasattr(e, "message") else e)
            if _http_status(reason, "401") or _http_status(reason, "403") or any(
                    word in reason for word in ("Unauthorized", "Forbidden", "PERMISSION_DENIED", "UNAUTHENTICATED")):
                raise UserError(_auth_failed(shown, reason)) from None
            raise StoreUnreachable(f"cannot reach the MLflow tracking server {shown} ({_short(reason)}); is `mlflow server` "
                                   f"running there? ({TRACKING_FIX})") from None
        except Exception as e:  # requests' own errors, a non-MLflow answer
            raise StoreUnreachable(f"cannot reach the MLflow tracking server {shown} ({_short(one_line(e))}); is `mlflow server` "
                                   f"running there? ({TRACKING_FIX})") from None


def _http_status(reason: str, code: str) -> bool:
    """Whether an HTTP status code stands in `reason` as a number of its own: not inside another
    number, nor a URL's port (the reason quotes the URL: port 40351 is no 403)."""
    return re.search(rf"(?<![\d:]){code}(?!\d)", reason) is not None


def _auth_failed(shown: str, reason: str) -> str:
    """The server wants a login (`mlflow server --app-name basic-auth`): which variables to set."""
    given = bool(os.environ.get("MLFLOW_TRACKING_USERNAME") or os.environ.get("MLFLOW_TRACKING_TOKEN"))
    code = "403" if (_http_status(reason, "403") or "Forbidden" in reason or "PERMISSION_DENIED" in reason) else "401"
    if code == "403":
        return (f"the MLflow server {shown} refused this user (HTTP 403: authenticated, but not permitted); ask its admin for "
                f"EDIT permission, or log in as another user with MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD")
    what = "the credentials in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD were refused" if given else "no credentials were given"
    return (f"authentication failed at the MLflow server {shown} (HTTP 401: {what}); set MLFLOW_TRACKING_USERNAME and "
            f"MLFLOW_TRACKING_PASSWORD in the environment (or MLFLOW_TRACKING_TOKEN), never on the command line")


def one_line(e: object) -> str:
    text = str(e).strip()
    # Drivers add hints on further lines and SQLAlchemy a "(Background on this error ...)" link.
    text = " ".join(part.strip() for part in text.splitlines() if part.strip() and not part.startswith("(Background"))
    return redact(text)


_CAUSE = re.compile(r"\[Errno -?\d+\] [^'\")\]]+|Read timed out|timed out|Connection refused|Name or service not known|"
                    r"No route to host|Network is unreachable|SSLError\([^)]*|\b[45]\d\d\b[^.;]*")


def _short(text: str, limit: int = 200) -> str:
    """The cause inside MLflow/requests' long message (connection refused, a timeout, an HTTP status)."""
    m = re.search(r"error code (\d{3})", text)
    if m:
        return f"HTTP {m.group(1)} to the MLflow REST API: not an MLflow server, or a proxy in the way?"
    m = _CAUSE.search(text)
    if m:
        return m.group(0).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."
