"""Optuna's gRPC storage proxy: many workers share one proxy process instead of each holding its own
database connections (Optuna's own advice past a few dozen workers).

`hpolab storage-proxy --storage postgresql+psycopg2://...` serves the database on grpc://HOST:PORT;
workers then take `--storage grpc://HOST:PORT` (or OPTUNA_STORAGE). What changes for them:
- no Optuna heartbeats (the proxy API has none): drivers beat by writing the trial system attr
  `hpolab.heartbeat` instead, and reap another host's trial once that attr stops changing
  (study/driver/heartbeat.py, AttrBeats); a dead worker on the same host is still recognised by its pid;
- the budget is kept exact optimistically (see study/state/budget.py: `over_budget`), since a database lock
  cannot be taken through the proxy.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from hpolab.errors import UserError
from hpolab.stores.paths import redact

DEFAULT_PORT = 13000
READY_TIMEOUT = 10  # seconds a worker waits for the proxy before saying it is unreachable


def is_grpc_url(url: str) -> bool:
    return url.startswith("grpc://")


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if not parts.hostname:
        raise UserError(f"--storage {redact(url)}: write grpc://HOST:PORT (the address `hpolab storage-proxy` prints)")
    try:
        return parts.hostname, parts.port or DEFAULT_PORT
    except ValueError:
        raise UserError(f"--storage {redact(url)}: the port must be a number 1..65535") from None


def grpc_storage(url: str):
    """A client of a running proxy, or one clear error when none answers."""
    from optuna.storages import GrpcStorageProxy

    host, port = host_port(url)
    storage = GrpcStorageProxy(host=host, port=port)
    try:
        storage.wait_server_ready(timeout=READY_TIMEOUT)
    except ConnectionError:
        from hpolab.errors import StoreUnreachable

        raise StoreUnreachable(f"no Optuna storage proxy answers at {redact(url)} (waited {READY_TIMEOUT} s); "
                         "start one with `hpolab storage-proxy --storage DATABASE_URL`") from None
    return storage


def make_proxy_server(database_url: str, host: str, port: int):
    """The gRPC server (not started) in front of the database. Optuna's cached RDB storage, with a
    connection pool that checks connections before use (a proxy outlives database restarts)."""
    import optuna
    from optuna.storages._grpc.server import make_server

    if is_grpc_url(database_url):
        raise UserError("storage-proxy: --storage must be the database (e.g. postgresql+psycopg2://...), not a grpc:// proxy")
    rdb = optuna.storages.RDBStorage(database_url, engine_kwargs={"pool_pre_ping": True} if not database_url.startswith("sqlite") else {})
    return make_server(optuna.storages.get_storage(rdb), host, port)  # get_storage adds Optuna's trial cache
