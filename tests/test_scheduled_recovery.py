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
