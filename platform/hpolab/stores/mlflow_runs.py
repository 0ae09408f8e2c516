"""MLflow side of a study: the experiment, the parent run, one child run per trial.

Explicit state: an MlflowClient and run ids, never the fluent active-run stack. The driver is
the only process that calls into here (SQLite is safe with one writer, and logging is batched).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterable

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

from hpolab.stores.paths import Stores, redact
from hpolab.stores.run_roles import ROLE, TRIAL
from hpolab.stores.sqlite_wal import checkpoint_at_exit

PARAM_BATCH = 100  # MLflow's log_batch limit for params
METRIC_BATCH = 1000  # and for metrics
MAX_PARAM_LEN = 6000


def quiet_mlflow() -> None:
    # MLflow logs INFO lines about DB migrations and artifact downloads; our terminal shows our own progress.
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # A tracking DB that cannot be reached: MLflow logs each failed call with a traceback, then raises
    # it; the driver retries it (study/state/outage.py) or reports it in one line, so the log is only noise.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def client_for(stores: Stores) -> MlflowClient:
    quiet_mlflow()
    _create_local_db(stores)
    checkpoint_at_exit(stores.tracking_db)
    return MlflowClient(tracking_uri=stores.tracking_uri)


def _create_local_db(stores: Stores) -> None:
    """Create a store's SQLite tracking DB with its artifact root inside the store.

    Left to MlflowClient, a new DB's "Default" experiment gets <working directory>/mlruns/0 as
    its artifact location, outside the store. The migrated schema comes from a per-version cache
    (stores/db_templates.py): migrating a new DB costs seconds.
    """
    db = stores.tracking_db
    if db is None or not stores.artifact_location or db.exists() or not db.parent.is_dir():  # a missing store folder stays an error of the caller's
        return
    import mlflow
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.utils.uri import append_to_uri_path

    from hpolab.stores.db_templates import point_default_experiment, seed_database

    location = append_to_uri_path(stores.artifact_location, "0")  # as SqlAlchemyStore names it
    if not seed_database(db, f"mlflow-{mlflow.__version__}",
                         create=lambda url: SqlAlchemyStore(url, stores.artifact_location).engine.dispose(),
                         prepare=lambda copy: point_default_experiment(copy, location, int(time.time() * 1000))):
        SqlAlchemyStore(stores.tracking_uri, stores.artifact_location).engine.dispose()


# Optuna study user attr: the MLflow experiment a study's runs go in, where it is not the study's own
# name (a promotion race's Optuna study: its seed runs sit in the raced study's experiment, registry/race.py)
EXPERIMENT_ATTR = "hpolab.mlflow_experiment"


def experiment_of(study) -> str:
    """The MLflow experiment of an Optuna study's runs: its EXPERIMENT_ATTR, else its name."""
    return study.user_attrs.get(EXPERIMENT_ATTR) or study.study_name


def get_or_create_experiment(client: MlflowClient, name: str, stores: Stores) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=stores.artifact_location)
    except Exception:
        # Another worker created it between our lookup and our create.
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = str(value)[:MAX_PARAM_LEN]
    return out


def log_params(client: MlflowClient, run_id: str, params: dict[str, str], new_run: bool = False) -> None:
    """`new_run`: the run was just created here, so it has no params yet (no read first)."""
    existing = {} if new_run else client.get_run(run_id).data.params
    # params are write-once; a value holding a URL never records its password
    items = [Param(k, redact(str(v))) for k, v in params.items() if k not in existing]
    for i in range(0, len(items), PARAM_BATCH):
        client.log_batch(run_id, params=items[i : i + PARAM_BATCH])


def set_tags(client: MlflowClient, run_id: str, tags: dict[str, str]) -> None:
    # A tag (a fail reason quoting an exception, say) never records a URL's password.
    client.log_batch(run_id, tags=[RunTag(k, redact(str(v))[:MAX_PARAM_LEN]) for k, v in tags.items()])


def close_failed(client: MlflowClient, run_id: str, error: BaseException) -> None:
    """Close a run FAILED with why (best effort: the caller re-raises `error` itself)."""
    try:
        set_tags(client, run_id, {"hpolab.fail_reason": f"{type(error).__name__}: {error}"})
        end_run(client, run_id, "FAILED")
    except Exception:  # noqa: BLE001  (the store may be what failed)
        pass


def close_if_running(client: MlflowClient, run_id: str, tags: dict[str, str], status: str) -> bool:
    """Tag and end a run unless it has ended already; whether it was closed here. A reaper closes a
    dead-looking driver's run this way: an owner that was alive after all has closed it itself,
    with the better reason (it knows it still ran), and that reason stays. (Check and write are two
    calls: an owner closing in between would be overwritten; the owner waits for this close first,
    wait_until_closed.) The tags are written before the status: once the run has ended, both are in."""
    if client.get_run(run_id).info.status != "RUNNING":
        return False
    set_tags(client, run_id, tags)
    end_run(client, run_id, status)
    return True


def wait_until_closed(client: MlflowClient, run_id: str, timeout: float, poll: float = 0.2) -> bool:
    """Whether the run has left RUNNING within `timeout` seconds (read every `poll` seconds)."""
    deadline = time.monotonic() + timeout
    while client.get_run(run_id).info.status == "RUNNING":
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True


def log_epoch(client: MlflowClient, run_id: str, epoch: int, metrics: dict[str, float]) -> None:
    """One batched write per epoch: every metric of that epoch, with step = epoch."""
    ts = int(time.time() * 1000)
    batch = [Metric(k, float(v), ts, epoch) for k, v in metrics.items() if isinstance(v, (int, float))]
    client.log_batch(run_id, metrics=batch)


def log_metrics(client: MlflowClient, run_id: str, metrics: list[Metric]) -> None:
    """Metric points (several steps at once: study/trials/metric_batches.py) in as few writes as MLflow allows."""
    for i in range(0, len(metrics), METRIC_BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + METRIC_BATCH])


def start_child_run(
    client: MlflowClient, experiment_id: str, parent_run_id: str, study: str, trial_number: int, tags: dict[str, str]
) -> str:
    run = client.create_run(
        experiment_id,
        run_name=f"trial-{trial_number}",
        tags={
            MLFLOW_PARENT_RUN_ID: parent_run_id,
            MLFLOW_RUN_NAME: f"trial-{trial_number}",
            "optuna.study": study,
            "optuna.trial_number": str(trial_number),
            ROLE: TRIAL,  # what tells it from a promote run, which names a trial number too (run_roles.py)
            "hpolab.state": "RUNNING",
            **tags,
        },
    )
    remember_artifact_uri(client, run.info.run_id, run.info.artifact_uri)
    return run.info.run_id


def remember_artifact_uri(client: MlflowClient, run_id: str, artifact_uri: str) -> None:
    """Put the run's artifact repository in MLflow's per-run cache (the one MlflowClient.log_artifact
    reads), so the run's first upload does not read the run back (a `runs/get`) for a URI known here."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
    from mlflow.tracking._tracking_service import utils

    cache = getattr(utils, "_artifact_repos_cache", None)
    if cache is not None and run_id not in cache:
        if len(cache) > 1024:  # as MLflow bounds it
            cache.popitem(last=False)
        cache[run_id] = get_artifact_repository(artifact_uri, tracking_uri=client.tracking_uri)


def artifact_repo(client: MlflowClient, run_id: str):
    """The run's artifact repository (MLflow's cached one: a run created here costs no request).
    `client.list_artifacts` instead goes through a `runs:/` repository: two `runs/get` and a
    `logged-models/search` per call."""
    return client._tracking_client._get_artifact_repo(run_id)


def end_run(client: MlflowClient, run_id: str, status: str) -> None:
    """End a run with `status` (FINISHED, FAILED, KILLED) now. MlflowClient.set_terminated reads the
    run back first (a `runs/get`) only to print its URL: a trial's close writes only."""
    from mlflow.entities import RunStatus

    client._tracking_client.store.update_run_info(run_id, run_status=RunStatus.from_string(status),
                                                  end_time=int(time.time() * 1000), run_name=None)


def find_runs(client: MlflowClient, experiment_id: str, filter_string: str) -> Iterable:
    page_token = None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, max_results=1000, page_token=page_token)
        yield from page
        page_token = page.token
        if not page_token:
            return


def runs_by_id(client: MlflowClient, experiment_id: str, run_ids: Iterable[str], deleted: bool = False) -> dict[str, Any]:
    """These runs of the experiment by id (`deleted`: deleted ones too, as get_run reads them): one
    search per mlflow_rest.RUN_IDS_PER_SEARCH ids, so reading K runs costs K runs, not the experiment's."""
    from mlflow.entities import ViewType

    from hpolab.stores.mlflow_rest import run_id_filters

    view = ViewType.ALL if deleted else ViewType.ACTIVE_ONLY
    out = {}
    for n, filter_string in run_id_filters(run_ids):
        out.update((run.info.run_id, run) for run in client.search_runs([experiment_id], filter_string, run_view_type=view, max_results=n))
    return out
