"""The stores an API call uses, and the process environment it leaves as it found it.

The same resolution as the CLI's global options (`--store`, `--storage`, `--tracking-uri`, then the
environment, then ./mlruns), checked before use. MLflow's `set_tracking_uri` (which the driver,
promote and predict call: MLflow's model APIs resolve their client from it) also exports
MLFLOW_TRACKING_URI into os.environ; in a long-lived process (a notebook) the next call's
resolution would then read the previous call's store from there. `keep_tracking_uri` undoes that.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator

ENV = "MLFLOW_TRACKING_URI"


def open_stores(store: str | Path | None = None, storage: str | None = None, tracking_uri: str | None = None,
                optuna: bool = True, tracking: bool = True, create: bool = True):
    """The resolved Stores, checked (one line, within seconds, if a URL is malformed, a driver is
    missing or a server does not answer). optuna/tracking: which of the two is opened (both False:
    resolve only); `create` False: a reading call, whose embedded store must exist already."""
    from hpolab.stores.paths import resolve_stores
    from hpolab.stores.preflight import check_stores

    stores = resolve_stores(str(store) if store is not None else None, storage, tracking_uri)
    if optuna or tracking:
        check_stores(stores, optuna=optuna, tracking=tracking, create=create)
    return stores


@contextlib.contextmanager
def keep_tracking_uri() -> Iterator[None]:
    """Restore MLflow's tracking URI (its module global and MLFLOW_TRACKING_URI) when the block ends."""
    before_env = os.environ.get(ENV)
    utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
    before_global = getattr(utils, "_tracking_uri", None) if utils is not None else None
    try:
        yield
    finally:
        utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
        if utils is not None and getattr(utils, "_tracking_uri", None) != before_global:
            import mlflow

            mlflow.set_tracking_uri(before_global)  # (None: MLflow's default again)
        if before_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before_env
