"""A deleted study's MLflow experiment: moved out of the study's name, and what still depends on it.

MLflow keeps a deleted experiment's name, and `get_or_create_experiment` restores an experiment of
the study's name, runs included, when a study of that name runs again: the old runs' trial numbers
would then collide with the new study's. So `hpolab study delete` renames the experiment
NAME.deleted-<time> and soft-deletes it, whatever its lifecycle stage: one deleted beforehand (in the
MLflow UI, with `mlflow experiments delete`) is renamed too. MLflow renames only active experiments:
such a one is restored for the rename and deleted again.

Registered model versions keep pointing at their source run (a promote run of the study): they load
while the experiment is in MLflow's trash and stop when `mlflow gc` purges it, hence a warning.
MLflow is imported by the caller (the client passed in): nothing heavy at import time.
"""

from __future__ import annotations

import time


def retire_experiment(client, exp, study_name: str) -> str | None:
    """Rename experiment `exp` NAME.deleted-<time> and soft-delete it; the new name, or None when it
    no longer holds the study's name and is deleted already (a study deleted before: nothing to do)."""
    if exp.lifecycle_stage == "deleted":
        if exp.name != study_name:
            return None
        client.restore_experiment(exp.experiment_id)  # (rename_experiment refuses a deleted experiment)
    renamed = f"{exp.name}.deleted-{time.strftime('%Y%m%d-%H%M%S')}"
    client.rename_experiment(exp.experiment_id, renamed)
    client.delete_experiment(exp.experiment_id)
    return renamed


def versions_sourced_in(client, experiment_id: str) -> list[tuple[str, str]]:
    """(registered model, version) of every model version whose source run is a run of the experiment
    (deleted runs too), in registry order."""
    from mlflow.entities import ViewType

    run_ids: set[str] = set()
    token = None
    while True:
        page = client.search_runs([experiment_id], run_view_type=ViewType.ALL, max_results=1000, page_token=token)
        run_ids.update(r.info.run_id for r in page)
        token = page.token
        if not token:
            break
    found: list[tuple[str, str]] = []
    token = None
    while run_ids:
        page = client.search_model_versions(max_results=1000, page_token=token)
        found += [(v.name, str(v.version)) for v in page if v.run_id in run_ids]
        token = page.token
        if not token:
            break
    return found
