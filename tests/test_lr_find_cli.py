"""`hpolab lr-find` and a study whose LR search space comes from the range test, via the real CLI."""

from __future__ import annotations

import optuna
import pytest
from mlflow import MlflowClient

from conftest import run_cli


@pytest.mark.slow
def test_lr_find_command(store, tmp_path):
    out = run_cli("--store", str(store), "lr-find", "studies/digits_cnn.yaml", "--out", str(tmp_path / "lr"))
    assert "suggest" in out.stdout.lower()
    assert (tmp_path / "lr" / "lr_range_test.png").stat().st_size > 10_000
    assert (tmp_path / "lr" / "lr_range_test.csv").read_text().startswith("step,lr,loss,smoothed_loss")
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = client.get_experiment_by_name("digits-cnn")
    (run,) = client.search_runs([exp.experiment_id], filter_string="attributes.run_name = 'lr-range-test'")
    suggestion = float(run.data.params["suggestion"])
    assert 1e-7 <= suggestion <= 10
    assert len(client.get_metric_history(run.info.run_id, "lr_test_loss")) >= 20


@pytest.mark.slow
def test_study_takes_its_lr_bounds_from_the_range_test(store):
    args = ["--store", str(store), "study", "run", "studies/digits_cnn_lr.yaml", "trainer.max_epochs=2", "pruner={type: none}", "log_models=none"]
    run_cli(*args, "n_trials=2")
    study = optuna.load_study(study_name="digits-cnn-lr", storage=f"sqlite:///{store / 'optuna.db'}")
    attr = study.user_attrs["lr_range_test"]
    low, high = attr["low"], attr["high"]
    assert 0 < low < high
    for t in study.trials:
        assert low <= t.params["trainer.lr"] <= high
        assert t.distributions["trainer.lr"].low == pytest.approx(low)

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    parent_id = study.user_attrs["mlflow_parent_run_id"]
    parent = client.get_run(parent_id)
    assert float(parent.data.params["search_space.trainer.lr.low"]) == pytest.approx(low)
    assert float(parent.data.params["search_space.trainer.lr.high"]) == pytest.approx(high)
    exp = client.get_experiment_by_name("digits-cnn-lr")
    lr_runs = client.search_runs([exp.experiment_id], filter_string="attributes.run_name = 'lr-range-test'")
    assert len(lr_runs) == 1
    assert lr_runs[0].data.tags["mlflow.parentRunId"] == parent_id
    assert {a.path for a in client.list_artifacts(lr_runs[0].info.run_id, "lr_range_test")} == {
        "lr_range_test/lr_range_test.png", "lr_range_test/lr_range_test.csv"}

    # resuming the study reuses the recorded test: no second range-test run, same bounds
    run_cli(*args, "n_trials=3")
    assert len(client.search_runs([exp.experiment_id], filter_string="attributes.run_name = 'lr-range-test'")) == 1
    study = optuna.load_study(study_name="digits-cnn-lr", storage=f"sqlite:///{store / 'optuna.db'}")
    assert len(study.trials) == 3 and study.user_attrs["lr_range_test"] == attr


def test_from_lr_range_test_without_the_test_is_a_spec_error(store):
    out = run_cli("--store", str(store), "study", "run", "studies/digits_cnn_lr.yaml", "lr_range_test.enabled=false", check=False)
    assert out.returncode == 2
    assert "search_space.trainer.lr: from_lr_range_test needs the range test; set lr_range_test.enabled: true" in out.stderr
    assert "Traceback" not in out.stderr
