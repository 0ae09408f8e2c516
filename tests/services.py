"""Real services for the scale-out tests: a throw-away PostgreSQL cluster and a real `mlflow server`.

PostgreSQL comes from Debian's package (`scripts/system-deps` installs it; CI runs that first) and runs
as the `postgres` user (it refuses to run as root), in a temp folder, on a free loopback port.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

PG_BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
HAVE_POSTGRES = bool(PG_BIN) and shutil.which("runuser") is not None
NO_POSTGRES = "PostgreSQL server binaries not installed (run scripts/system-deps)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_postgres(*cmd: str, **kw) -> subprocess.CompletedProcess:
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run([*prefix, *cmd], check=True, capture_output=True, text=True, **kw)


@contextmanager
def postgres_cluster(user: str = "postgres", password: str | None = None):
    """Yields (bin_dir, port). With a password, TCP logins need it (scram-sha-256), as in production."""
    bin_dir = Path(PG_BIN[-1])
    # Not under pytest's tmp dir: that is private to root, and the server runs as `postgres`.
    base = Path(tempfile.mkdtemp(prefix="hpolab-pg-"))
    data = base / "data"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
        shutil.chown(data, "postgres")
    auth = ["--auth=trust"]
    if password is not None:
        pwfile = base / "pw"
        pwfile.write_text(password + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres")
        auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
    port = free_port()
    as_postgres(str(bin_dir / "initdb"), "-D", str(data), "-U", user, *auth, "-E", "UTF8")
    as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-w", "-l", str(data / "log"),
                "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
    try:
        yield bin_dir, port, data
    finally:
        as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(base, ignore_errors=True)


def wait_for_http(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.5)
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}: {proc.stderr.read()[-3000:] if proc.stderr else ''}")
    proc.kill()
    raise AssertionError(f"{url} did not come up in {timeout:g} s")
