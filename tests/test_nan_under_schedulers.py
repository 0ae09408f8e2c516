"""A study metric that is NaN under a trial scheduler, through the real CLI: a PBT member NaN at a
boundary ranks worst and exploits a healthy member (the boundary does not wait for it forever);
under ASHA a trial whose metric was never finite fails at its rung with the reason a plain study
gives, and its epochs count against budget.epochs."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, assert_study_check_clean, open_study, run_cli, trial_run

ASHA = "trial_scheduler={type: asha, min_epochs: 1, max_epochs: 2, reduction_factor: 2}"


@pytest.mark.slow
def test_a_pbt_member_nan_at_a_boundary_ranks_worst_and_exploits(store):
    out = run_cli("--store", str(store), "study", "run", "studies/nanmember.yaml", cwd=FAULT_PROJECT, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    client, study = open_study(store, "nanmember")
    healthy, broken = study.get_trials()
    assert [healthy.state, broken.state] == [TrialState.COMPLETE, TrialState.COMPLETE], out.stdout
    assert broken.params["model.nan_metric"] is True and healthy.params["model.nan_metric"] is False
    assert trial_run(broken, client).data.tags["hpolab.pbt_parents"].startswith("0@1")  # it took the healthy member's checkpoint at 1
    assert sorted(broken.intermediate_values) == [1, 2, 3]  # its NaN epoch was told: the boundary did not wait for it
    assert "never promoted" not in out.stdout and "epochs used: 6" in out.stdout
    assert_study_check_clean(store, "nanmember", cwd=FAULT_PROJECT)


@pytest.mark.slow
def test_an_asha_trial_whose_metric_is_never_finite_fails_at_its_rung_and_counts_its_epochs(store):
    out = run_cli("--store", str(store), "study", "run", "studies/nanmetric.yaml", "n_trials=4", ASHA, "budget.epochs=3",
                  "max_failures=null", cwd=FAULT_PROJECT, check=False)
    client, study = open_study(store, "nanmetric")
    trials = study.get_trials()
    assert len(trials) == 3 and all(t.state == TrialState.FAIL for t in trials), out.stdout  # budget.epochs stopped it at 3
    for t in trials:
        reason = trial_run(t, client).data.tags["hpolab.fail_reason"]
        assert reason.startswith("the study metric val_score was never finite (NaN or inf after each of 1 epochs)"), reason
    assert "epochs used: 3 / 3 (budget.epochs)" in out.stdout and "PRUNED" not in out.stdout, out.stdout
    assert_study_check_clean(store, "nanmetric", cwd=FAULT_PROJECT)


@pytest.mark.slow
def test_pbt_members_left_paused_by_a_spent_budget_say_so_not_asha_words(store, tmp_path):
    from kill_harness import run_driver

    run = run_driver(store, "pbt", "pbt-budget", None, tmp_path, extra=("budget.epochs=2",))  # both pause at epoch 1: spent
    assert run.returncode == 0, run.output
    assert "never promoted" not in run.output and "rung" not in run.output.split("study pbt-budget: 2/2 finished")[0], run.output
    assert "PRUNED at boundary 0 (epoch 1): not resumed" in run.output and "2 pruned at a boundary (not resumed)" in run.output, run.output
    assert "no trial reached the end (epoch 2); the best at boundary 0 (epoch 1): trial 0" in run.output, run.output
