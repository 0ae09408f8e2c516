"""Trial runs a killed driver left open in MLflow, closed by the next driver on the same host.

A driver tells Optuna first and closes the MLflow run after (a COMPLETE trial's model is logged in
the background, seconds). Killed in between, it leaves a finished Optuna trial whose run says
RUNNING; killed between creating a run and linking it to its trial, it leaves a run no trial
points at. The next driver closes the first kind with the trial's state and deletes the second
(empty: the trial that was starting is retried with a run of its own). Only runs whose owner is
known to be gone (owners.py) are touched: another live driver may still be logging its model. A
trial that ended while paused (lifecycle.end_paused: Optuna told, then its run closed) has no
owner process at all: a driver killed between the two leaves its run open, and any driver closes it.
Before the close, the epochs whose batch the dead driver never wrote are logged (metric_backfill.py).
"""

from __future__ import annotations

from typing import Callable

import optuna
from optuna.trial import TrialState

from hpolab.stores.paths import Stores
from hpolab.stores.run_roles import is_trial_run
from hpolab.stores.trial_states import last_pause
from hpolab.study.state.lifecycle import PAUSED_OWNER
from hpolab.study.state.metric_backfill import backfill_run
from hpolab.study.state.owners import owner_gone, owner_of


def close_orphan_runs(client, experiment_id: str, study: optuna.Study, close_run: Callable, note: Callable[[str], None],
                      stores: Stores | None = None) -> int:
    """Close (or delete) the study's trial runs left RUNNING by a dead driver; returns how many.
    `stores`: where the trial folders are (their last.pt restores epochs the run lacks)."""
    runs = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=5000)
    trials = study.get_trials(deepcopy=False)
    fixed = 0
    for run in runs:
        if not is_trial_run(run.data.tags, study.study_name):
            continue  # a promote run (it names the trial it promotes), another Optuna study's trial run (a race's): never touched here
        number = run.data.tags.get("optuna.trial_number")
        if number is None or not number.isdigit() or int(number) >= len(trials):
            continue
        t = trials[int(number)]
        if t.state in (TrialState.RUNNING, TrialState.WAITING):
            continue  # running: the reaper's business
        # A trial that ended while paused (its owner record has no process: lifecycle.end_paused tells
        # Optuna, then closes the run) has no driver that may still write its run: closed here too.
        ended_paused = bool((owner_of(t) or {}).get(PAUSED_OWNER))
        if not ended_paused and not owner_gone(owner_of(t)):
            continue  # its owner may be alive
        run_id = run.info.run_id
        if t.user_attrs.get("mlflow_run_id") != run_id:
            client.delete_run(run_id)  # never linked to its trial: empty
        else:
            tags = {"hpolab.closed_by": "a later driver (the trial's driver died before closing its run)"}
            tags.update(backfill_run(client, run_id, t, study.user_attrs.get("metric"),
                                     stores and stores.trial_dir(study.study_name, t.number), stores and stores.tracking_uri, note=note))
            mark = last_pause(t)
            if ended_paused and mark:
                tags["hpolab.rung"] = str(mark.get("rung"))
            elif t.state == TrialState.COMPLETE:
                tags["hpolab.model_error"] = "the driver died before the model was logged"
            elif t.state == TrialState.FAIL:  # its reason died with the driver (tell came first, the close was queued)
                tags["hpolab.fail_reason"] = "unknown: the trial's driver died before closing its run"
            close_run(run_id, t.state, tags)
        fixed += 1
    if fixed:
        note(f"closed {fixed} MLflow run(s) that a killed driver had left RUNNING")
    return fixed


def delete_unlinked_runs(client, experiment_id: str, study: optuna.Study, number: int) -> int:
    """Trial `number`'s runs that it does not point at (a dead driver made one and died before linking
    it): deleted when a driver takes the claimed trial over (they are empty). How many. Only this Optuna
    study's runs: the experiment also holds a promotion race's seed runs, whose trial numbers repeat."""
    linked = study._storage.get_trial(study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)).user_attrs
    runs = client.search_runs([experiment_id], filter_string=f"tags.`optuna.trial_number` = '{number}'", max_results=100)
    gone = [r.info.run_id for r in runs if is_trial_run(r.data.tags, study.study_name) and r.info.run_id != linked.get("mlflow_run_id")]
    for run_id in gone:
        client.delete_run(run_id)
    return len(gone)
