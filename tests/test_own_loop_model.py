"""An own loop's logged model: the weights its metrics describe, and a model that takes any batch size.

tests/own_loop_project/experiments/tiny_loop.py reports a curve the test decides and (`mark`) sets its
model's bias to the epoch after each epoch, so what the logged model predicts on zeros says which
epoch's weights it holds. classic_mnist.py is PyTorch's MNIST example, logging its model with the
example's habit of a one-row input (`x[0:1]`). Through the real CLI.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from optuna.trial import TrialState

from conftest import open_study, run_cli, trial_run

PROJECT = Path(__file__).parent / "own_loop_project"
TINY = ["n_trials=1", "search_space={}", "sampler={type: random}", "pruner={type: none}", "trainer.max_epochs=2",
        "model.curve=[0.9, 0.5]", "model.mark=true"]


def _model_of(store: Path, run):
    import mlflow.pyfunc

    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    return mlflow.pyfunc.load_model(run.data.tags["hpolab.model_uri"])


def _linked(client, run) -> dict[str, tuple[int, float]]:
    model = client.get_logged_model(run.data.tags["hpolab.model_id"])
    return {m.key: (m.step, m.value) for m in model.metrics or []}


@pytest.mark.slow
@pytest.mark.parametrize("keep, epoch, value", [("final", 2, 0.5), ("best", 1, 0.9)])
def test_the_logged_model_holds_the_weights_of_the_epoch_its_metrics_and_value_are_from(store, keep, epoch, value):
    run_cli("--store", str(store), "study", "run", "studies/tiny_loop.yaml", *TINY, f"model.keep={keep}", cwd=PROJECT)
    client, study = open_study(store, "tiny-loop")
    (t,) = study.get_trials()
    run = trial_run(t, client)
    assert t.state == TrialState.COMPLETE and t.value == pytest.approx(value)
    assert run.data.tags["hpolab.model_epoch"] == run.data.tags["hpolab.best_epoch"] == str(epoch)
    predicted = np.asarray(_model_of(store, run).predict(np.zeros((3, 4), dtype=np.float32)))
    assert predicted.shape == (3, 2) and np.allclose(predicted, epoch)  # the weights are that epoch's
    assert _linked(client, run)["val_acc"] == (epoch, pytest.approx(value))  # the Models tab describes them
    check = run_cli("--store", str(store), "study", "check", "tiny-loop", cwd=PROJECT, check=False)
    assert check.returncode == 0, check.stdout

    client.set_tag(run.info.run_id, "hpolab.best_epoch", str(3 - epoch))  # a value from another epoch than the weights
    check = run_cli("--store", str(store), "study", "check", "tiny-loop", cwd=PROJECT, check=False)
    assert check.returncode == 1 and f"its logged model holds epoch {epoch}'s weights" in " ".join(check.stdout.split())


@pytest.mark.slow
def test_a_model_logged_with_a_one_row_example_takes_any_batch_and_promotes(store, tmp_path):
    run_cli("--store", str(store), "study", "run", "studies/classic_mnist.yaml", "n_trials=1", "model.example_rows=1", cwd=PROJECT)
    client, study = open_study(store, "classic-mnist")
    (t,) = study.get_trials()
    run = trial_run(t, client)
    x = np.random.default_rng(0).random((5, 1, 8, 8), dtype=np.float32)
    assert np.asarray(_model_of(store, run).predict(x)).shape == (5, 4)
    run_cli("--store", str(store), "promote", "classic-mnist", cwd=PROJECT)
    np.save(tmp_path / "five.npy", x)
    out = run_cli("--store", str(store), "predict", "models:/classic-mnist@champion", str(tmp_path / "five.npy"), cwd=tmp_path)
    assert len([line for line in out.stdout.splitlines() if line.strip()[:1].isdigit()]) == 5, out.stdout


def test_a_model_that_takes_one_batch_size_fails_its_trial_with_one_line(store):
    out = run_cli("--store", str(store), "study", "run", "studies/tiny_loop.yaml", "n_trials=1", "search_space={}",
                  "sampler={type: random}", "model.log_model=bad_example", cwd=PROJECT, check=False)
    client, study = open_study(store, "tiny-loop")
    (t,) = study.get_trials()
    assert t.state == TrialState.FAIL, out.stdout
    reason = trial_run(t, client).data.tags["hpolab.fail_reason"]
    assert reason.startswith("trial.log_model: the model cannot run on its input example (RuntimeError: mat1 and mat2 shapes")


def test_trials_tied_on_the_study_metric_are_ranked_by_their_loss_and_it_is_said(store):
    out = run_cli("--store", str(store), "study", "run", "studies/tiny_loop.yaml", "sampler={type: random}", "pruner={type: none}",
                  "model.quality=0.9", "search_space={model.val_loss: {type: categorical, choices: [0.5, 0.2]}}",
                  "enqueue=[{model.val_loss: 0.5}, {model.val_loss: 0.2}]", cwd=PROJECT)
    _, study = open_study(store, "tiny-loop")
    by_loss = {t.params["model.val_loss"]: t.number for t in study.get_trials()}
    lower = by_loss[0.2]  # both reach val_acc 0.9; the lower val_loss (the later trial) is the better one
    assert lower == 1
    line = f"trials {lower} and {by_loss[0.5]} tie at 0.9; the lower val_loss (0.2 vs 0.5) puts trial {lower} first"
    assert line in out.stdout, out.stdout
    table = run_cli("--store", str(store), "compare", "tiny-loop", "--format", "csv", cwd=PROJECT).stdout.splitlines()
    assert table[1].startswith(f"{lower},"), table
    promote = run_cli("--store", str(store), "promote", "tiny-loop", "--dry-run", "--force", cwd=PROJECT)
    assert f"best by val_acc (maximize): trial {lower} " in promote.stdout and line in " ".join(promote.stdout.split())
