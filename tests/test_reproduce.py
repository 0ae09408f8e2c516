"""`hpolab reproduce RUN_ID`: a trial retrained from its MLflow run gives identical metrics."""

from __future__ import annotations

import json
import re

import pytest
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, ROOT, hpolab_env, open_study, run_cli


@pytest.mark.slow
def test_a_trial_reproduces_exactly(store):
    run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", "n_trials=2", "trainer.max_epochs=2",
            "pruner={type: none}", "log_models=none")
    rows = json.loads(run_cli("--store", str(store), "compare", "digits-cnn", "--format", "json").stdout)
    for row in rows:
        out = run_cli("--store", str(store), "reproduce", row["run_id"])
        assert "reproduced: identical" in out.stdout, out.stdout


def test_reproduce_unknown_run_is_a_clear_error(store):
    out = run_cli("--store", str(store), "reproduce", "0" * 32, check=False)
    assert out.returncode == 2 and "no run" in out.stderr and "Traceback" not in out.stderr


# The routine (the faulty experiment's data + model, the built-in train) and an own loop (tiny_loop's
# train(config, trial)) are reproduced the same way: their train in this process with a trial that
# records the reports, stopped where the run stopped (a pruned trial too), every reported metric the
# run has compared, timing excepted.
KINDS = {
    "routine": (FAULT_PROJECT, "studies/faulty.yaml", "faulty", ["n_trials=1", "trainer.scheduler=cosine"],
                {"train_loss", "val_loss", "val_acc", "lr", "grad_norm"}),
    "own loop": (ROOT / "tests" / "own_loop_project", "studies/tiny_loop.yaml", "tiny-loop", ["n_trials=1"],
                 {"val_acc", "train_loss", "steps", "start_epoch", "opt_lr"}),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_either_kind_of_experiment_is_reproduced_through_its_train_with_every_reported_metric(store, kind):
    project, spec, name, args, reported = KINDS[kind]
    run_cli("--store", str(store), "study", "run", spec, *args, "pruner={type: threshold, kwargs: {lower: 0.99}}",
            "log_models=none", cwd=project, check=False)
    client, study = open_study(store, name)
    (t,) = study.get_trials()
    assert t.state == TrialState.PRUNED  # (after its first epoch: the replay must stop there too)
    out = run_cli("--store", str(store), "reproduce", t.user_attrs["mlflow_run_id"], cwd=project,
                  env={**hpolab_env(), "COLUMNS": "400"})
    assert "reproduced: identical" in out.stdout, out.stdout
    header = next(line for line in out.stdout.splitlines() if "epoch" in line and "original" in line)
    assert {m for m in reported if f"{m} original" in header} == reported, header
    assert "epoch_seconds" not in header and "samples_per_second" not in header
    assert len([line for line in out.stdout.splitlines() if re.match(r"\W*\d+\s*[│|]", line)]) == 1, out.stdout
