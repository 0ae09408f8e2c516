"""`study check` on a trial scheduler's study whose driver was SIGKILLed mid-segment offers the
recovery the next `study run` makes (the segment put back to paused in the same trial and run), and
`--repair` makes exactly that: no FAIL, no retry copy, no second run (real CLI, tests/kill_harness.py)."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from conftest import assert_study_check_clean, open_study, run_cli
from kill_harness import KINDS, assert_no_crash, run_driver


@pytest.mark.slow
def test_check_repairs_a_dead_segment_by_putting_it_back_as_the_next_run_would(store, tmp_path):
    project = KINDS["asha"][0]
    killed = run_driver(store, "asha", "mid", ("segment_started", "after", "2"), tmp_path)  # trial 1 trains, its driver dies
    assert killed.killed_at, killed.output
    import time

    time.sleep(2)  # (its trial process ends with its lifeline: the checkpoint it wrote stays)
    check = run_cli("--store", str(store), "study", "check", "mid", cwd=project, check=False)
    assert check.returncode == 1 and "put it back to paused in the same trial and run" in check.stdout, check.stdout
    assert "retry copy" not in check.stdout, check.stdout
    repair = run_cli("--store", str(store), "study", "check", "mid", "--repair", cwd=project, check=False)
    assert "repaired: trial 1: put back to paused" in repair.stdout, repair.stdout
    client, study = open_study(store, "mid")
    trials = study.get_trials()
    assert len(trials) == 2 and not [t.number for t in trials if t.state == TrialState.FAIL], [t.state for t in trials]
    runs = client.search_runs([client.get_experiment_by_name("mid").experiment_id])
    assert len([r for r in runs if "optuna.trial_number" in r.data.tags]) == 2  # one run per trial, none added
    finish = run_driver(store, "asha", "mid", None, tmp_path)
    assert_no_crash(finish)
    assert_study_check_clean(store, "mid", cwd=project)
    _, study = open_study(store, "mid")
    assert len(study.get_trials()) == 4 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.get_trials())


@pytest.mark.slow
def test_a_run_left_open_by_a_driver_killed_while_ending_a_paused_trial_is_closed_by_the_next_run(store, tmp_path):
    # lifecycle.end_paused tells Optuna PRUNED, then closes the run: a driver SIGKILLed between the two
    # (e.g. by another of its threads' kill point) leaves the run RUNNING and PAUSED, owned by no process.
    # That state is made here from a finished study (the kill lands between a step's writes, where
    # no kill point is); the next `study run` closes the run as the dead driver would have.
    from mlflow import MlflowClient

    project = KINDS["asha"][0]
    assert_no_crash(run_driver(store, "asha", "ended", None, tmp_path))
    client, study = open_study(store, "ended")
    [t, *_] = [t for t in study.get_trials() if t.state == TrialState.PRUNED]
    run_id = t.user_attrs["mlflow_run_id"]
    assert client.get_run(run_id).info.status == "KILLED"
    client.set_tag(run_id, "hpolab.state", "PAUSED")
    client.update_run(run_id, status="RUNNING")
    check = run_cli("--store", str(store), "study", "check", "ended", cwd=project, check=False)
    assert check.returncode == 1 and "Optuna says PRUNED" in check.stdout, check.stdout
    rerun = run_driver(store, "asha", "ended", None, tmp_path)
    assert_no_crash(rerun)
    assert "closed 1 MLflow run(s) that a killed driver had left RUNNING" in rerun.output, rerun.output
    assert_study_check_clean(store, "ended", cwd=project)
    run = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}").get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["hpolab.state"] == "PRUNED"
    assert run.data.tags["hpolab.rung"] == str(t.system_attrs["hpolab.paused"]["rung"]), run.data.tags
