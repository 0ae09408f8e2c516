"""Tasks: the loss, the metrics and the served predictions follow the experiment's TASK.

Unit layer: the task objects and fit() on fabricated tensors (tiny, in-process). End-to-end layer: the
shipped regression and multi-label examples through the real CLI (study with pruning -> promote ->
predict), and the spec errors caught before any trial runs.
"""

from __future__ import annotations

import math
import types

import numpy as np
import optuna
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from conftest import run_cli
from hpolab.train import DataSplits, TrainConfig, fit
from hpolab.train.tasks import Custom, Multilabel, Regression, multilabel_stats, regression_stats, task_for


def _mlp(n_in: int, n_out: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(n_in, 16), nn.ReLU(), nn.Linear(16, n_out))


def _regression_splits(k: int = 1) -> DataSplits:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 4, generator=g)
    y = 100 + 30 * x[:, :k].sum(1, keepdim=True).repeat(1, k) + torch.randn(96, k, generator=g)
    y = y.squeeze(1) if k == 1 else y
    ds = lambda s: TensorDataset(x[s], y[s])  # noqa: E731
    return DataSplits(ds(slice(0, 64)), ds(slice(64, 96)), ds(slice(64, 96)), num_classes=k, input_shape=(4,))


CFG = dict(max_epochs=3, batch_size=16, lr=1e-2, scheduler="none", device="cpu", amp="off")


# ---------------------------------------------------------------- unit


def test_regression_metrics_are_in_the_targets_units_and_match_sklearn():
    from sklearn.metrics import mean_absolute_error, r2_score

    data = _regression_splits()
    model = _mlp(4, 1)
    result = fit(TrainConfig(**CFG, standardize_targets=True), model, data, metric="val_rmse", direction="minimize", task=Regression())
    m = result.last_metrics
    assert {"train_loss", "val_loss", "val_rmse", "val_mae", "val_r2"} <= set(m) and "val_acc" not in m
    # recompute by hand: model outputs are standardized; the metrics undo it with the train split's mean/std
    y_train = data.train.tensors[1].double()
    x_val, y_val = data.val.tensors
    with torch.no_grad():
        pred = model(x_val).double().squeeze(1) * y_train.std(unbiased=False) + y_train.mean()
    assert m["val_rmse"] == pytest.approx(float((pred - y_val).pow(2).mean().sqrt()), rel=1e-5)
    assert m["val_mae"] == pytest.approx(mean_absolute_error(y_val, pred), rel=1e-5)
    assert m["val_r2"] == pytest.approx(r2_score(y_val, pred), rel=1e-5)
    assert result.best_value == min(h["val_rmse"] for h in result.history)


def test_two_output_regression_and_r2_averaged_like_sklearn():
    from sklearn.metrics import r2_score

    y, p = torch.randn(50, 2, dtype=torch.float64), torch.randn(50, 2, dtype=torch.float64)
    assert regression_stats(p, y)["r2"] == pytest.approx(r2_score(y, p))
    result = fit(TrainConfig(**CFG, regression_loss="huber"), _mlp(4, 2), _regression_splits(2), metric="val_mae",
                 direction="minimize", task=Regression())
    assert math.isfinite(result.best_value)


def test_multilabel_metrics_match_sklearn():
    from sklearn.metrics import average_precision_score, f1_score

    g = torch.Generator().manual_seed(1)
    y = (torch.rand(200, 3, generator=g) < 0.4).double()
    p = (0.6 * y + 0.7 * torch.rand(200, 3, generator=g, dtype=torch.float64)).clamp(0, 1)
    s = multilabel_stats(p, y, 0.5)
    pred = (p >= 0.5).numpy()
    assert s["micro_f1"] == pytest.approx(f1_score(y, pred, average="micro"))
    assert s["macro_f1"] == pytest.approx(f1_score(y, pred, average="macro"))
    assert s["map"] == pytest.approx(average_precision_score(y, p, average="macro"))


def test_custom_task_metrics_become_study_metrics():
    def loss(outputs, targets):
        return nn.functional.l1_loss(outputs.squeeze(1), targets.float())

    def metrics(outputs, targets):
        return {"val_within_10": float(((outputs.squeeze(1) - targets).abs() < 10).double().mean())}

    exp = types.SimpleNamespace(__name__="exp", TASK="custom", loss=loss, metrics=metrics, METRIC_DIRECTIONS={"val_within_10": "maximize"})
    task = task_for(exp)
    assert isinstance(task, Custom) and task.metric_directions(TrainConfig()) == {"val_loss": "minimize", "val_within_10": "maximize"}
    result = fit(TrainConfig(**CFG), _mlp(4, 1), _regression_splits(), metric="val_within_10", task=task)
    assert 0 <= result.last_metrics["val_within_10"] <= 1
    with pytest.raises(ValueError, match="METRIC_DIRECTIONS"):
        task_for(types.SimpleNamespace(TASK="custom", loss=loss, metrics=metrics, METRIC_DIRECTIONS={"iou": "up"}))
    with pytest.raises(ValueError, match="not a task"):
        task_for(types.SimpleNamespace(TASK="segmentation"))


def test_wrong_targets_are_one_clear_error_before_training():
    calls = []
    reg = _regression_splits()
    as_labels = DataSplits(TensorDataset(reg.train.tensors[0], reg.train.tensors[1].long()), reg.val, reg.test, 1, (4,))
    with pytest.raises(ValueError, match="task regression expects float targets"):
        fit(TrainConfig(**CFG), _mlp(4, 1), as_labels, metric="val_rmse", direction="minimize", task=Regression(),
            on_epoch=lambda e, m: calls.append(e))
    with pytest.raises(ValueError, match="task classification expects integer class labels"):
        fit(TrainConfig(**CFG), _mlp(4, 1), reg, on_epoch=lambda e, m: calls.append(e))
    with pytest.raises(ValueError, match=r"task multilabel expects targets of shape \(N, 1\)"):
        fit(TrainConfig(**CFG), _mlp(4, 1), reg, metric="val_map", task=Multilabel())
    with pytest.raises(ValueError, match="regression_loss: applies to task regression"):
        fit(TrainConfig(**CFG, regression_loss="l1"), _mlp(4, 1), reg, metric="val_map", task=Multilabel())
    assert calls == []


# ---------------------------------------------------------------- the real CLI


@pytest.mark.slow
def test_spec_metric_is_checked_against_the_task_before_any_trial(store):
    out = run_cli("--store", str(store), "study", "run", "studies/diabetes_mlp.yaml", "metric=val_acc", "direction=maximize", check=False)
    assert out.returncode == 2
    text = " ".join((out.stdout + out.stderr).split())
    assert "'val_acc' is not a metric of task regression" in text and "val_rmse, val_mae, val_r2" in text
    assert "Traceback" not in text
    assert optuna.study.get_all_study_summaries(f"sqlite:///{store / 'optuna.db'}") == []  # no study, no trial
    out = run_cli("study", "validate", "studies/diabetes_mlp.yaml", "metric=val_r2", check=False)
    assert out.returncode == 2 and "val_r2 should be maximized for task regression" in " ".join(out.stdout.split() + out.stderr.split())
    out = run_cli("study", "validate", "studies/digits_cnn.yaml", "metric=val_macro_f1", check=False)
    assert out.returncode == 2 and "imbalance option" in out.stdout + out.stderr


def _study_prune_promote(store, spec: str, name: str, pruner: str) -> optuna.Study:
    """2 trials (pruner none), then a third that the threshold pruner stops after epoch 1; then promote."""
    tiny = ["parallel=2", "trainer.max_epochs=3", "sampler.kwargs={n_startup_trials: 2}"]
    run_cli("--store", str(store), "study", "run", spec, *tiny, "n_trials=2", "pruner={type: none}")
    # a pruner for the third trial: a spec change the study is told about
    run_cli("--store", str(store), "study", "run", spec, *tiny, "n_trials=3", f"pruner={pruner}", "log_models=none", "--allow-spec-change")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{store / 'optuna.db'}")
    states = [t.state for t in study.get_trials()]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 2 and states[2] == optuna.trial.TrialState.PRUNED
    return study


@pytest.mark.slow
def test_regression_study_prunes_promotes_and_predicts_in_the_targets_units(store, tmp_path):
    import mlflow
    from mlflow import MlflowClient

    import experiments.diabetes_mlp as dm

    study = _study_prune_promote(store, "studies/diabetes_mlp.yaml", "diabetes-mlp", "{type: threshold, kwargs: {upper: 1.0}}")
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    run = client.get_run(study.best_trial.user_attrs["mlflow_run_id"])
    assert {"val_rmse", "val_mae", "val_r2", "val_loss"} <= set(run.data.metrics) and "val_acc" not in run.data.metrics

    out = run_cli("--store", str(store), "promote", "--no-race", "diabetes-mlp")
    assert "test_rmse" in out.stdout and "test_r2" in out.stdout
    mv = client.get_model_version_by_alias("diabetes-mlp", "champion")
    assert mv.tags["hpolab.gate_metric"] == "test_rmse" and mv.tags["hpolab.task"] == "regression"
    x, y = dm.raw_test(dm.DATA_DEFAULTS, 0)
    np.save(tmp_path / "x.npy", x)
    run_cli("--store", str(store), "predict", "models:/diabetes-mlp@champion", str(tmp_path / "x.npy"), "--out", str(tmp_path / "p.npy"))
    pred = np.load(tmp_path / "p.npy").reshape(-1)
    rmse = float(np.sqrt(np.mean((pred.astype(np.float64) - y) ** 2)))
    assert rmse == pytest.approx(float(mv.tags["hpolab.test_rmse"]), rel=1e-5)  # the user's units, end to end
    assert 20 < rmse < 120  # disease-progression units (targets 25..346), not standardized ones
    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    served = mlflow.pyfunc.load_model("models:/diabetes-mlp@champion").predict(x[:4])
    assert list(served.columns) == ["prediction"] and np.allclose(served["prediction"], pred[:4])


@pytest.mark.slow
def test_multilabel_study_prunes_promotes_and_predicts_probabilities(store, tmp_path):
    from mlflow import MlflowClient

    import experiments.digits_multilabel as ml

    _study_prune_promote(store, "studies/digits_multilabel.yaml", "digits-multilabel", "{type: threshold, kwargs: {lower: 0.9999}}")
    out = run_cli("--store", str(store), "promote", "--no-race", "digits-multilabel")
    assert "test_map" in out.stdout
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    mv = client.get_model_version_by_alias("digits-multilabel", "champion")
    assert mv.tags["hpolab.gate_metric"] == "test_map" and float(mv.tags["hpolab.test_map"]) > 0.8
    x, y = ml.raw_test(ml.DATA_DEFAULTS, 0)
    np.save(tmp_path / "x.npy", x[:5])
    out = run_cli("--store", str(store), "predict", "models:/digits-multilabel@champion", str(tmp_path / "x.npy"))
    lines = out.stdout.strip().splitlines()
    labels = ["even", "greater_than_4", "loop"]
    assert lines[0].split("\t") == ["input", *(f"label_{c}" for c in labels), *(f"prob_{c}" for c in labels)] and len(lines) == 6
    rows = np.array([[float(v) for v in line.split("\t")[1:7]] for line in lines[1:]])
    assert ((rows[:, 3:] >= 0) & (rows[:, 3:] <= 1)).all()
    assert (rows[:, :3] == (rows[:, 3:] >= 0.5)).all()  # the 0/1 labels at the study's threshold
