"""`hpolab launch k8s --with-stores`: the Secret's values, generated into OUT/stores.env.

The stores it deploys are new, so hpolab can make their passwords: random, written to a file only
its owner reads (mode 600) and that git ignores (OUT/.gitignore), for
`kubectl create secret generic --from-env-file`. Never into a manifest or onto stdout. An existing
stores.env is kept: the stores were created with its passwords.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from hpolab.launch.k8s_parts import MLFLOW_PORT, POSTGRES_PORT

ADMIN = "hpolab-admin"  # the MLflow server's first admin; the workers log in as it


def _values() -> dict[str, str]:
    pg, mlflow, csrf = (secrets.token_hex(24) for _ in range(3))  # hex: safe inside a database URL
    db = f"postgresql+psycopg2://hpolab:{pg}@hpolab-postgres:{POSTGRES_PORT}"
    return {"OPTUNA_STORAGE": f"{db}/optuna", "MLFLOW_TRACKING_URI": f"http://hpolab-mlflow:{MLFLOW_PORT}",
            "POSTGRES_PASSWORD": pg, "MLFLOW_BACKEND_STORE_URI": f"{db}/mlflow",
            "MLFLOW_TRACKING_USERNAME": ADMIN, "MLFLOW_TRACKING_PASSWORD": mlflow, "MLFLOW_FLASK_SERVER_SECRET_KEY": csrf}


def write_stores_env(out: Path) -> tuple[Path, bool]:
    """(path, True if written now; False if it was there and is kept)."""
    path = out / "stores.env"
    ignore = out / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# generated passwords (hpolab launch k8s --with-stores): never commit them\nstores.env\n")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # mode 600 from the start
    except FileExistsError:
        return path, False
    lines = ["# the Secret for `hpolab launch k8s --with-stores` (generated; never commit it)",
             *(f"{k}={v}" for k, v in _values().items())]
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path, True
