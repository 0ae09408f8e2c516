"""The salt that keeps concurrent workers' samplers apart, on any host and in any container.

A process id is no salt across machines: every container's worker runs as PID 1, and two hosts
reuse pids. The salt hashes the host name, the pid, the start time and random bits from the OS,
so two workers started together draw different points even with the same pid. It is recorded on
each trial (MLflow tag `hpolab.worker_seed`, Optuna user attr `worker_seed`) with the sampler seed
it gave (`hpolab.sampler_seed`), which is what reproducing that worker's proposals needs.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time


def worker_salt(host: str | None = None, pid: int | None = None, start_ns: int | None = None,
                random_bits: bytes | None = None) -> int:
    """A salt in [1, 2**31) from host, pid, start time and random bits (each defaults to this process's)."""
    host = socket.gethostname() if host is None else host
    pid = os.getpid() if pid is None else pid
    start_ns = time.time_ns() if start_ns is None else start_ns
    random_bits = os.urandom(16) if random_bits is None else random_bits
    digest = hashlib.blake2b(f"{host}|{pid}|{start_ns}|".encode() + random_bits, digest_size=8).digest()
    return 1 + int.from_bytes(digest, "big") % (2**31 - 1)

