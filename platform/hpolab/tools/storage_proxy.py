"""`hpolab storage-proxy`: Optuna's gRPC storage proxy in front of the study database.

Run it once (next to PostgreSQL); every worker then uses `--storage grpc://HOST:PORT`. It stops
cleanly on Ctrl-C or SIGTERM (`docker stop`), letting requests in flight finish.

It has no login and no TLS (Optuna's proxy has neither): whoever reaches its port can read and rewrite
every study. So it listens on loopback only, unless `--allow-unauthenticated-remote` says in so many
words that the operator means it (a private network firewalled to the workers; README: "Who can reach
the servers").
"""

from __future__ import annotations

import ipaddress
import signal
import threading

from hpolab.errors import EXIT_BAD_INPUT, EXIT_OK, UserError
from hpolab.stores.grpc_proxy import make_proxy_server

GRACE_SECONDS = 5  # requests in flight may finish before the proxy stops


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname other than localhost may resolve to any interface


def check_bind(host: str, allow_remote: bool) -> None:
    if not is_loopback(host) and not allow_remote:
        raise UserError(f"--host {host}: the storage proxy has no login or TLS; keep 127.0.0.1 and give workers an SSH "
                        "tunnel, or add --allow-unauthenticated-remote on a private, firewalled network")


def storage_proxy_cmd(args, stores) -> int:
    if not 1 <= args.port <= 65535:
        print(f"hpolab: --port {args.port}: use a port number 1..65535")
        return EXIT_BAD_INPUT
    check_bind(args.host, args.allow_unauthenticated_remote)
    stopped = threading.Event()

    def on_signal(signum, frame):
        stopped.set()

    # Before the server answers anything: a SIGTERM sent once a client was served must stop it cleanly.
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server = make_proxy_server(stores.optuna_url, args.host, args.port)
        server.start()
    except RuntimeError as e:  # grpc: the address is not this machine's, or the port is taken
        for s, h in previous.items():
            signal.signal(s, h)
        raise UserError(f"--host {args.host} --port {args.port}: cannot listen there ({e}); "
                        "give an address of this machine and a free port") from None
    from sqlalchemy.engine import make_url

    shown = make_url(stores.optuna_url).render_as_string(hide_password=True)
    print(f"Optuna storage proxy for {shown} on grpc://{args.host}:{args.port}", flush=True)
    if not is_loopback(args.host):
        print("  no authentication, no TLS: anyone who reaches this port can read and change every study", flush=True)
    print(f"  workers: hpolab --storage grpc://<this host>:{args.port} worker studies/<spec>.yaml   (Ctrl-C to stop)", flush=True)
    try:
        # Waits in short steps: the kernel may deliver the signal to one of gRPC's threads, which does not
        # wake a main thread blocked on a lock; Python runs the handler when the main thread next wakes.
        while not stopped.wait(0.5):
            pass
    finally:
        server.stop(GRACE_SECONDS).wait(GRACE_SECONDS + 5)
        for s, h in previous.items():
            signal.signal(s, h)
    print("storage proxy stopped", flush=True)
    return EXIT_OK
