"""Shared fixtures: a temporary store per test, seeded from stores migrated once per session.

Creating an MLflow SQLite DB runs all its migrations (seconds); copying a migrated one is instant.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory) -> Path:
    template = tmp_path_factory.mktemp("template-store")
    from mlflow import MlflowClient
    import optuna

    from hpolab.tracking.runs import quiet_mlflow

    quiet_mlflow()
    MlflowClient(tracking_uri=f"sqlite:///{template / 'mlflow.db'}").search_experiments()
    optuna.storages.RDBStorage(f"sqlite:///{template / 'optuna.db'}")
    optuna.storages.RDBStorage(f"sqlite:///{template / 'optuna.db'}").engine.dispose()
    return template


@pytest.fixture
def store(tmp_path, migrated_store) -> Path:
    """A fresh store folder (mlflow.db + optuna.db already migrated) for one test."""
    d = tmp_path / "store"
    d.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, d / name)
    (d / "artifacts").mkdir()
    return d


def hpolab_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPTUNA_STORAGE", "MLFLOW_TRACKING_URI", "HPOLAB_STORE")}
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "200"
    return env


def run_cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 600, check: bool = True):
    """Run the real `hpolab` console script (the one the README tells users to run)."""
    exe = Path(sys.executable).with_name("hpolab")
    cmd = [str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else ["-m", "hpolab.cli"]), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env or hpolab_env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"hpolab {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc
