"""`hpolab ui`: MLflow's own UI over the store in use, bound to localhost by default."""

from __future__ import annotations

import signal
import subprocess
import sys

from hpolab.stores import Stores


def mlflow_server_command(stores: Stores, host: str, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", stores.tracking_uri, "--host", host, "--port", str(port), "--workers", "1"]
    if stores.artifact_location:
        # Serve artifacts through the server so the browser can open them (plots, reports, models).
        cmd += ["--artifacts-destination", stores.artifact_location]
    return cmd


def serve(stores: Stores, host: str = "127.0.0.1", port: int = 5000) -> int:
    if stores.tracking_uri.startswith(("http://", "https://")):
        print(f"the tracking store is already a server: open {stores.tracking_uri}")
        return 0
    if stores.tracking_uri.startswith("sqlite:///"):
        stores.root.mkdir(parents=True, exist_ok=True)
    cmd = mlflow_server_command(stores, host, port)
    print(f"MLflow UI for {stores.tracking_uri}\n  open http://{host}:{port}   (Ctrl-C to stop)", flush=True)
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        print("MLflow UI stopped")
        return 0
