"""`hpolab storage-proxy`: Optuna's gRPC storage proxy in front of the study database.

Run it once (next to PostgreSQL); every worker then uses `--storage grpc://HOST:PORT`. It stops
cleanly on Ctrl-C or SIGTERM (`docker stop`), letting requests in flight finish.
"""

from __future__ import annotations

import signal
import threading

from hpolab.errors import EXIT_BAD_INPUT, EXIT_OK
from hpolab.stores.grpc_proxy import make_proxy_server

GRACE_SECONDS = 5  # requests in flight may finish before the proxy stops


def storage_proxy_cmd(args, stores) -> int:
    if not 1 <= args.port <= 65535:
        print(f"hpolab: --port {args.port}: use a port number 1..65535")
        return EXIT_BAD_INPUT
    server = make_proxy_server(stores.optuna_url, args.host, args.port)
    server.start()
    from sqlalchemy.engine import make_url

    shown = make_url(stores.optuna_url).render_as_string(hide_password=True)
    print(f"Optuna storage proxy for {shown} on grpc://{args.host}:{args.port}", flush=True)
    print(f"  workers: hpolab --storage grpc://<this host>:{args.port} worker studies/<spec>.yaml   (Ctrl-C to stop)", flush=True)
    stopped = threading.Event()

    def on_signal(signum, frame):
        stopped.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        stopped.wait()
    finally:
        server.stop(GRACE_SECONDS).wait()
        for s, h in previous.items():
            signal.signal(s, h)
    print("storage proxy stopped", flush=True)
    return EXIT_OK
