"""Checkpoints in the MLflow artifact store: upload, fetch for a retry on any worker, delete.

A running trial's latest `last.pt` (and `best.pt`) go to its run's `checkpoints/`, overwritten
each time (latest only). A retry on a worker that cannot see the dead attempt's trial folder (another
machine) downloads them from there. Retention deletes them through the run's artifact repository
(local folders and an `mlflow server --serve-artifacts` proxy both support deletes).
"""

from __future__ import annotations

import shutil
from pathlib import Path

CHECKPOINTS = "checkpoints"  # the run's artifact folder: last.pt and best.pt


def upload_checkpoints(client, run_id: str, folder: Path) -> None:
    """Upload every file of `folder` (last.pt, maybe best.pt) into the run's checkpoints/, then
    remove the folder (a staging copy: see study/trials/uploads.py)."""
    try:
        client.log_artifacts(run_id, str(folder), CHECKPOINTS)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def fetch_checkpoint(tracking_uri: str, run_id: str, dst: Path) -> Path | None:
    """Download the run's checkpoints/last.pt (and best.pt, when uploaded) into `dst`; the local
    last.pt, or None when the run has none (it died before its first upload)."""
    from mlflow import MlflowClient
    from mlflow.artifacts import download_artifacts

    client = MlflowClient(tracking_uri=tracking_uri)
    names = {Path(a.path).name for a in client.list_artifacts(run_id, CHECKPOINTS)}
    if "last.pt" not in names:
        return None
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("last.pt", "best.pt"):
        if name in names:  # best.pt beside last.pt: the resumed routine keeps the best epoch's weights
            download_artifacts(run_id=run_id, artifact_path=f"{CHECKPOINTS}/{name}", dst_path=str(dst), tracking_uri=tracking_uri)
    last = dst / "last.pt"
    if not last.is_file():
        return None
    from hpolab.train.checkpoint import load_checkpoint

    try:  # a driver killed in the middle of an upload to a plain folder can leave a partial file
        load_checkpoint(last, map_location="cpu")
    except Exception as e:
        shutil.rmtree(dst, ignore_errors=True)
        raise ValueError(f"the uploaded checkpoint is unreadable ({type(e).__name__}: {e})") from None
    return last


def delete_checkpoints(client, run_id: str, name: str | None = None) -> None:
    """Delete the run's checkpoints/ (or only checkpoints/`name`) from the artifact store."""
    from hpolab.stores.mlflow_runs import artifact_repo

    artifact_repo(client, run_id).delete_artifacts(f"{CHECKPOINTS}/{name}" if name else CHECKPOINTS)


def delete_logged_model(client, model_id: str) -> None:
    """Delete a logged model: its files (delete_logged_model alone only marks it deleted until
    `mlflow gc`) and its record."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    model = client.get_logged_model(model_id)
    get_artifact_repository(model.artifact_location).delete_artifacts()
    if model.artifact_location.startswith("file:"):  # a local folder: its now empty models/<id>/ too
        from mlflow.utils.file_utils import local_file_uri_to_path

        try:
            Path(local_file_uri_to_path(model.artifact_location)).parent.rmdir()
        except OSError:
            pass
    client.delete_logged_model(model_id)


def local_artifact_dir(uri: str) -> Path | None:
    """The folder of a file: (or plain path) artifact URI; None for a remote store."""
    if uri.startswith("file:"):  # as MLflow's local_file_uri_to_path, without importing MLflow
        from urllib.parse import urlparse
        from urllib.request import url2pathname

        return Path(url2pathname(urlparse(uri).path))
    if uri.startswith("/"):
        return Path(uri)
    return None
