"""The real CLI end to end on a tiny digits study: both stores are checked afterwards."""

from __future__ import annotations

import optuna
import pytest
from mlflow import MlflowClient

from conftest import run_cli

TINY = ["n_trials=3", "parallel=2", "trainer.max_epochs=3", "pruner={type: none}", "sampler.kwargs={n_startup_trials: 2}"]


def _stores(store):
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    study = optuna.load_study(study_name="digits-cnn", storage=f"sqlite:///{store / 'optuna.db'}")
    return client, study


@pytest.mark.slow
def test_study_run_end_to_end(store):
    out = run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", *TINY)
    assert f"hpolab --store {store} ui" in out.stdout  # (the hint names the store it was given)

    client, study = _stores(store)
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert all(len(t.intermediate_values) == 3 for t in trials)

    exp = client.get_experiment_by_name("digits-cnn")
    assert exp is not None
    parent_id = study.user_attrs["mlflow_parent_run_id"]
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["hpolab.trials_finished"] == "3"
    assert "spec.yaml" in [a.path for a in client.list_artifacts(parent_id)]
    assert parent.data.tags["hpolab.spec_hash"] == study.user_attrs["hpolab.spec_hash"]

    children = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")
    assert sorted(r.info.run_name for r in children) == ["trial-0", "trial-1", "trial-2"]
    for t in trials:
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        tags, params = run.data.tags, run.data.params
        assert run.info.run_name == f"trial-{t.number}"
        assert tags["optuna.trial_number"] == str(t.number)
        assert tags["optuna.study"] == "digits-cnn"
        assert tags["hpolab.state"] == "COMPLETE"
        assert run.info.status == "FINISHED"
        for key in ("env.python", "env.torch", "env.torchvision", "env.cuda", "env.cudnn", "env.gpu", "env.optuna",
                    "env.mlflow", "env.hpolab", "env.git_commit", "env.git_dirty", "env.hostname"):
            assert tags.get(key), key
        # the full resolved config, sampled values included
        assert float(params["trainer.lr"]) == pytest.approx(t.params["trainer.lr"])
        assert params["model.channels"] == str(t.params["model.channels"])
        assert params["trainer.max_epochs"] == "3"
        for metric in ("train_loss", "val_loss", "val_acc", "lr", "grad_norm", "epoch_seconds", "samples_per_second", "data_wait_fraction"):
            history = client.get_metric_history(run.info.run_id, metric)
            assert [m.step for m in history] == [1, 2, 3], metric
        # the study's value is the best epoch's metric
        best = max(m.value for m in client.get_metric_history(run.info.run_id, "val_acc"))
        assert t.value == pytest.approx(best)
        artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
        assert "config.yaml" in artifacts
        assert "checkpoints/best.pt" in [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")]
        assert tags["hpolab.model_uri"].startswith("models:/")

    # the logged model loads and predicts
    import mlflow.pytorch
    import numpy as np

    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    best_run = client.get_run(study.best_trial.user_attrs["mlflow_run_id"])
    try:
        model = mlflow.pytorch.load_model(best_run.data.tags["hpolab.model_uri"])
    finally:
        mlflow.set_tracking_uri(None)  # it is process-global (and exported as MLFLOW_TRACKING_URI)
    out = model(__import__("torch").zeros(2, 1, 8, 8))
    assert tuple(out.shape) == (2, 10) and np.isfinite(out.detach().numpy()).all()

    # a second run of the same command does not add trials beyond the budget
    again = run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", *TINY, "log_models=none")
    assert "3/3" in again.stdout
    _, study = _stores(store)
    assert len(study.get_trials()) == 3

    # raising the budget continues the same study, same parent run
    run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", *TINY[1:], "n_trials=4", "log_models=none")
    _, study = _stores(store)
    assert len(study.get_trials()) == 4
    assert study.user_attrs["mlflow_parent_run_id"] == parent_id

    status = run_cli("--store", str(store), "study", "status", "digits-cnn")
    assert "COMPLETE" in status.stdout and "4 complete" in status.stdout
