"""`hpolab promote` takes the same steps whichever loop trained the trials: the platform's routine
(digits_cnn: its model rebuilt from best.pt, scored by its task) or an own `train(config, trial)`
(digits_own_loop: its logged model, scored by its evaluate()). Each test runs once per kind, through
the real CLI, on a study of two objectives: the gate checks every objective for both kinds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from conftest import run_cli

KINDS = {
    "routine": ("digits_cnn", "{channels: 4}"),
    "own loop": ("digits_own_loop", "{hidden: 32, dropout: 0.0}"),
}

SPEC = """\
name: two-objectives
experiment: {experiment}
objectives:
  - {{metric: val_acc, direction: maximize}}
  - {{metric: val_loss, direction: minimize}}
n_trials: 2
parallel: 2
seed: 0
sampler: {{type: random}}
pruner: {{type: none}}
trainer: {{max_epochs: 2, batch_size: 64, lr: 3.0e-3, weight_decay: 0.01}}
model: {model}
search_space:
  trainer.lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_every_objective_gates_the_promotion_whichever_loop_trained_the_trials(store, tmp_path, kind):
    experiment, model = KINDS[kind]
    spec = tmp_path / "two_objectives.yaml"
    spec.write_text(SPEC.format(experiment=experiment, model=model))
    run_cli("--store", str(store), "study", "run", str(spec))

    dry = run_cli("--store", str(store), "promote", "--no-race", "two-objectives", "--pick", "max val_acc", "--dry-run")
    assert "every objective (epoch metrics on the test split" in dry.stdout and "dry run: would register" in dry.stdout, dry.stdout
    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert not client.search_registered_models()  # a dry run writes nothing

    out = run_cli("--store", str(store), "promote", "--no-race", "two-objectives", "--pick", "max val_acc")
    lines = out.stdout.splitlines()
    assert any(x.strip().startswith("val_acc (maximize): challenger") for x in lines), out.stdout
    assert any(x.strip().startswith("val_loss (minimize): challenger") for x in lines), out.stdout
    assert "registered two-objectives version 1" in out.stdout, out.stdout
    v = client.get_model_version_by_alias("two-objectives", "champion")
    assert v.tags["hpolab.gate"] == "every objective: val_acc, val_loss", v.tags
    # each objective's gate value is the model's test metric, recorded for the next promotion's gate
    assert float(v.tags["hpolab.objective.val_acc"]) == pytest.approx(float(v.tags["hpolab.test_acc"]))
    assert float(v.tags["hpolab.objective.val_loss"]) == pytest.approx(float(v.tags["hpolab.test_loss"]))
    again = run_cli("--store", str(store), "promote", "--no-race", "two-objectives", "--pick", "max val_acc")
    assert "nothing to do" in again.stdout, again.stdout



@pytest.mark.slow
def test_a_trial_whose_best_checkpoint_is_gone_is_promoted_from_the_model_it_logged(store, tmp_path):
    from urllib.parse import urlparse

    run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", "n_trials=1", "parallel=1",
            "trainer.max_epochs=1", "pruner={type: none}", "model.channels=4", "search_space={}")
    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
              if r.data.tags.get("optuna.trial_number") == "0"]
    checkpoints = Path(urlparse(run.info.artifact_uri).path) / "checkpoints"
    assert (checkpoints / "best.pt").is_file()
    shutil.rmtree(checkpoints)  # as retention does to a trial beyond keep_checkpoints' top_k

    out = run_cli("--store", str(store), "promote", "--no-race", "digits-cnn")
    assert "registered digits-cnn version 1" in out.stdout and "ONNX" in out.stdout, out.stdout
    v = client.get_model_version_by_alias("digits-cnn", "champion")
    assert v.tags["hpolab.trial_model_uri"] == run.data.tags["hpolab.model_uri"] and float(v.tags["hpolab.test_acc"]) > 0.1
    x = np.random.default_rng(0).integers(0, 17, (3, 8, 8)).astype(np.float32)  # raw digits, as predict takes them
    np.save(tmp_path / "x.npy", x)
    pred = run_cli("--store", str(store), "predict", "models:/digits-cnn@champion", str(tmp_path / "x.npy"))
    assert len([line for line in pred.stdout.splitlines() if line[:1].isdigit()]) == 3, pred.stdout
