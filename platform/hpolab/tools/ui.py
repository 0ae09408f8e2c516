"""`hpolab ui`: MLflow's own UI over the store in use, bound to localhost by default.

The MLflow server runs as a child process in its own process group (it starts uvicorn and
helpers of its own): Ctrl-C (SIGINT) or SIGTERM on `hpolab ui` stops that whole group, waits for
it, prints "MLflow UI stopped" and exits 0, so no server is left holding the port.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from hpolab.stores.paths import Stores

STOP_GRACE_SECONDS = 10  # after SIGTERM, then SIGKILL
READY_TIMEOUT_SECONDS = 120  # the server imports a lot; a loaded laptop can take a minute


def mlflow_server_command(stores: Stores, host: str, port: int) -> list[str]:
    # The backend store URI (it may hold a password) goes through the environment, never the
    # command line, which every user of the machine can read (`ps`): see server_env().
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port), "--workers", "1"]
    if stores.artifact_location:
        # Serve artifacts through the server so the browser can open them (plots, reports, models).
        cmd += ["--artifacts-destination", stores.artifact_location]
    return cmd


def server_env(stores: Stores) -> dict[str, str]:
    env = dict(os.environ)
    env["MLFLOW_BACKEND_STORE_URI"] = stores.tracking_uri  # `mlflow server --backend-store-uri`'s envvar
    # MLflow's background job runner (GenAI scorers, trace rollups) starts eight more processes;
    # nothing hpolab logs needs it. A user can still turn it on by setting the variable.
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    return env


def check_address(host: str, port: int) -> None:
    """UserError (one line, exit 2) unless the server could listen on host:port now."""
    from hpolab.errors import UserError

    if not 1 <= port <= 65535:
        raise UserError(f"--port {port} is not a TCP port: pick one in 1..65535 (e.g. --port 5000)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(f"--host {host!r} is not an address of this machine ({e}); use --host 127.0.0.1 and reach the UI "
                        "from elsewhere through an SSH tunnel (ssh -N -L PORT:127.0.0.1:PORT THIS_HOST); the UI has no login, "
                        "so bind a wider address only behind authentication or on a firewalled private network") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # Like the server itself: connections of a previous server in TIME_WAIT do not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is in use (another `hpolab ui`?); pick another with --port N") from None
            if e.errno == errno.EACCES:
                raise UserError(f"port {port} on {host} needs privileges (ports below 1024); pick another with --port N "
                                "(e.g. --port 5000)") from None
            raise UserError(f"cannot listen on {host}:{port} ({e.strerror}); use --host 127.0.0.1 or an address of this "
                            "machine, and --port N") from None


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, then SIGKILL whatever is left after the grace period."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # helpers that outlive the server, if any
    except ProcessLookupError:
        pass
    proc.wait()


class _Stop(Exception):
    pass


def serve(stores: Stores, host: str = "127.0.0.1", port: int = 5000) -> int:
    if stores.tracking_kind == "server":
        print(f"the tracking store is already a server: open {stores.tracking_shown}")
        return 0
    check_address(host, port)
    if stores.tracking_db is not None:
        stores.root.mkdir(parents=True, exist_ok=True)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    print(f"MLflow UI for {stores.tracking_shown}\n  open {url}   (Ctrl-C to stop)", flush=True)

    def on_signal(signum, frame):
        raise _Stop()

    # Explicit handlers: a process started in the background by a shell inherits SIGINT ignored.
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    proc = None
    try:
        proc = subprocess.Popen(mlflow_server_command(stores, host, port), env=server_env(stores), start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        announced = False
        while True:
            code = proc.poll()
            if code is not None:
                print(f"MLflow server exited with code {code}", file=sys.stderr)
                return code or 1
            if not announced and time.monotonic() < deadline and _ready(url):
                print(f"MLflow UI ready at {url}", flush=True)
                print(f"  (runs of an experiment as tables and charts: {url}/#/experiments/<id>/runs?workflowType=machine_learning)", flush=True)
                announced = True
            time.sleep(0.5)
    except (_Stop, KeyboardInterrupt):
        if proc is not None:
            _stop_group(proc)
        print("MLflow UI stopped", flush=True)
        return 0
    finally:
        if proc is not None and proc.poll() is None:  # any other exit path: never leave the server behind
            _stop_group(proc)
        for s, h in previous.items():
            signal.signal(s, h)
