"""Own training loops under trial schedulers, through the real CLI: PBT's new values reach the optimizer
the loop restored (trial.apply_config_changes; the Lightning callback does it itself), a loop that never
looks at them is refused; under ASHA a loop that never checkpoints cannot pause.

tests/own_loop_project: tiny_loop.py reports `opt_lr`, the LR its optimizer trained with, and applies a
resume's changes when `model.changes=apply`; lightning_user.py logs the same from its LightningModule.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import hpolab_env, open_study, run_cli, trial_run

PROJECT = Path(__file__).parent / "own_loop_project"


def _exploited(client, study):
    trials = study.get_trials()
    exploited = [t for t in trials if "hpolab.pbt_exploited_from" in trial_run(t, client).data.tags]
    assert len(exploited) == 1, [(t.number, t.state) for t in trials]
    return exploited[0]


def _history(client, t, metric: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(t.user_attrs["mlflow_run_id"], metric)}


@pytest.mark.parametrize("spec, args", [
    ("studies/tiny_pbt.yaml", ["model.changes=apply"]),
    ("studies/lightning_user.yaml", ["name=lightning-pbt", "sampler={type: grid}", "search_space={trainer.lr: {type: categorical, choices: [0.001, 0.1]}}",
                                     "trial_scheduler={type: pbt, population: 2, interval_epochs: 1, quantile: 0.5, "
                                     "mutations: {trainer.lr: {factor: [0.5, 2.0]}}, resample_probability: 0}"]),
])
def test_pbt_gives_the_explored_learning_rate_to_the_restored_optimizer(store, spec, args):
    out = run_cli("--store", str(store), "study", "run", spec, *args, "--hide-trial-output", cwd=PROJECT)
    name = "tiny-pbt" if "tiny" in spec else "lightning-pbt"
    client, study = open_study(store, name)
    assert all(t.state == TrialState.COMPLETE for t in study.get_trials()), out.stdout
    t = _exploited(client, study)
    new_lr = t.user_attrs["hpolab.pbt_schedule"]["2"]["trainer.lr"]
    trained = _history(client, t, "opt_lr")
    assert trained[2] == pytest.approx(new_lr), (trained, new_lr)  # what the schedule records is what it trained with
    assert _history(client, t, "pbt.trainer.lr") == {2: pytest.approx(new_lr)}
    if "tiny" in spec:  # its replay: the schedule stretch by stretch, the new lr given to the optimizer restored in between
        replay = run_cli("--store", str(store), "reproduce", t.user_attrs["mlflow_run_id"], cwd=PROJECT,
                         env={**hpolab_env(), "COLUMNS": "300"})
        assert "replaying its schedule" in replay.stdout and "reproduced: identical" in replay.stdout, replay.stdout
        header = next(line for line in replay.stdout.splitlines() if "opt_lr original" in line).replace("┃", "│")
        column = [c.strip() for c in header.split("│")].index("opt_lr original") + 1  # (its "reproduced" column)
        epoch2 = next(line for line in replay.stdout.splitlines() if re.match(r"\W*2\s*│", line))
        assert float(epoch2.split("│")[column]) == pytest.approx(new_lr, rel=1e-5), replay.stdout


def test_a_loop_that_never_reads_the_changes_of_a_pbt_resume_is_refused_with_one_line(store):
    out = run_cli("--store", str(store), "study", "run", "studies/tiny_pbt.yaml", cwd=PROJECT, check=False)
    client, study = open_study(store, "tiny-pbt")
    t = _exploited(client, study)
    assert t.state == TrialState.FAIL and out.returncode == 1, out.stdout
    reason = trial_run(t, client).data.tags["hpolab.fail_reason"]
    assert reason.startswith("this attempt resumed with the trial scheduler's changes trainer.lr: ")
    assert "call trial.apply_config_changes(optimizer, schedulers) after restoring it" in reason
    assert 2 not in _history(client, t, "val_acc")  # nothing trained with values the records would misstate


def test_under_asha_a_loop_without_checkpoints_fails_at_its_rung_with_one_line_and_logs_no_epoch_twice(store):
    out = run_cli("--store", str(store), "study", "run", "studies/tiny_loop.yaml", "n_trials=4", "model.checkpoint=false",
                  "pruner=null", "sampler={type: random}", "search_space={model.quality: {type: float, low: 0.1, high: 0.9}}",
                  "trial_scheduler={type: asha, min_epochs: 1, max_epochs: 3, reduction_factor: 2}", "budget={epochs: 20}",
                  cwd=PROJECT, check=False)
    client, study = open_study(store, "tiny-loop")
    trials = study.get_trials()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert failed and out.returncode == 1, out.stdout
    reason = trial_run(failed[0], client).data.tags["hpolab.fail_reason"]
    assert reason.startswith("train() reached its pause at epoch 1 without a checkpoint")
    assert "UserWarning" not in out.stdout + out.stderr
    for t in trials:
        steps = sorted(m.step for m in client.get_metric_history(t.user_attrs["mlflow_run_id"], "val_acc"))
        assert steps == sorted(set(steps)), (t.number, steps)  # no epoch logged twice
    status = run_cli("--store", str(store), "study", "status", "tiny-loop", cwd=PROJECT)
    trained = sum(max(t.intermediate_values, default=0) for t in trials)
    assert f"epochs used: {trained}" in status.stdout, status.stdout  # what was trained is what the budget counts
