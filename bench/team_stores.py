"""A team's stores on this machine, for bench/scale.py --stores team: PostgreSQL (the Optuna database and
MLflow's backend database) and `mlflow server` with served artifacts, natively on 127.0.0.1, as
docker-compose.yml runs them (without its login: nothing here listens beyond loopback).

Everything lives under one folder (DIR/pg: the cluster, DIR/server-artifacts: MLflow's artifacts), so a
second run with --reuse starts the same stores again. PostgreSQL runs as the `postgres` user when this
runs as root (it refuses to run as root), from Debian's binaries (scripts/system-deps installs them).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

PG_BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(*cmd: str) -> subprocess.CompletedProcess:
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run([*prefix, *cmd], check=True, capture_output=True, text=True)


def _open_path_to(folder: Path) -> None:
    """The `postgres` user must reach the cluster's folder: every folder above it traversable (mkdtemp's are 0700)."""
    for p in folder.parents:
        if p == Path("/"):
            break
        mode = p.stat().st_mode
        if mode & 0o001 == 0:
            p.chmod(mode | 0o011)


@contextmanager
def postgres(folder: Path, max_connections: int = 200) -> Iterator[int]:
    """A PostgreSQL cluster in `folder` (made once, started again when it exists), databases `optuna` and
    `mlflow`; yields its port. Stopped on exit, kept on disk."""
    if not PG_BIN:
        sys.exit("scale: PostgreSQL server binaries are not installed (run scripts/system-deps)")
    bin_dir = Path(PG_BIN[-1])
    data = folder / "pg"
    fresh = not (data / "PG_VERSION").exists()
    data.mkdir(parents=True, exist_ok=True)
    _open_path_to(data)
    data.chmod(0o700)  # (PostgreSQL refuses a data folder others may enter)
    if os.geteuid() == 0:
        shutil.chown(data, "postgres")
    if fresh:
        _as_postgres(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
    port = free_port()
    # fsync off as in tests/services.py: a benchmark's store, not a team's data
    _as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-w", "-l", str(data / "log"), "-o",
                 f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections={max_connections}", "start")
    try:
        if fresh:
            for db in ("optuna", "mlflow"):
                _as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", db)
        yield port
    finally:
        _as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop")


@contextmanager
def mlflow_server(folder: Path, pg_port: int, env: dict[str, str]) -> Iterator[str]:
    """`mlflow server` with a PostgreSQL backend and served artifacts (compose's command, one worker
    process as its default); yields its URL. Its access log goes to folder/mlflow-server.log."""
    port = free_port()
    artifacts = folder / "server-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    log = (folder / "mlflow-server.log").open("a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"postgresql+psycopg2://postgres@127.0.0.1:{pg_port}/mlflow",
         "--artifacts-destination", artifacts.as_uri(), "--serve-artifacts", "--host", "127.0.0.1", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env={**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"scale: mlflow server did not start; see {folder / 'mlflow-server.log'}")
        time.sleep(0.5)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@contextmanager
def team_stores(folder: Path, env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """(Optuna storage URL, MLflow tracking URI) of the stores in `folder`, running until the block ends."""
    with postgres(folder) as port:
        with mlflow_server(folder, port, env) as url:
            yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/optuna", url


def connections(storage: str, database: str | None = None) -> int:
    """Client connections to the cluster (pg_stat_activity's client backends), to `database` only if given."""
    import psycopg2

    with psycopg2.connect(storage.replace("postgresql+psycopg2://", "postgresql://")) as con, con.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                    + (" AND datname = %s" if database else ""), (database,) if database else ())
        return cur.fetchone()[0]
