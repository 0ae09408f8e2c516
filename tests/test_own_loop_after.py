"""After an own-loop study (`train(config, trial)`): promote, predict, reproduce, compare, report, study
check and study status through the real CLI, on experiments/digits_own_loop.py.

One small study runs once per module (3 trials x 3 epochs, no pruning) and a deliberately worse one
(1 trial at lr 1e-6) of the same experiment; tests that write work on a copy of that store. The gate's
rules themselves are tested on fabricated metrics (no training).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, run_cli

SPEC = "studies/digits_own_loop.yaml"
STUDY = "digits-own-loop"
SMALL = ["n_trials=3", "parallel=2", "trainer.max_epochs=3", "pruner={type: none}"]
BAD = ["name=digits-own-loop-bad", "n_trials=1", "parallel=1", "trainer.max_epochs=1", "trainer.lr=1e-6",
       "search_space={}", "pruner={type: none}"]


# ------------------------------------------------------------------ the gate's rules (no training)


def test_a_model_that_does_not_export_is_skipped_with_its_reason(tmp_path):
    import torch

    from hpolab.registry.evaluation import export_or_skip

    class GpuOnly(torch.nn.Module):  # a loop's model may refuse to run where promote runs
        def forward(self, x):
            raise RuntimeError("this model only runs on the GPU it was trained on")

    x = np.zeros((2, 4), np.float32)
    assert export_or_skip(GpuOnly(), x, tmp_path) == (None, "RuntimeError: this model only runs on the GPU it was trained on")
    assert export_or_skip(GpuOnly(), None, tmp_path) == (None, "the logged model has no array input example")
    exports, why = export_or_skip(torch.nn.Linear(4, 3).eval(), x, tmp_path)
    assert why is None and exports.onnx.is_file() and exports.onnx_diff <= 1e-5


# ------------------------------------------------------------------ the real CLI on a real study


@pytest.fixture(scope="module")
def studied(tmp_path_factory, migrated_store) -> Path:
    store = tmp_path_factory.mktemp("own-loop-after") / "studied"
    store.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, store / name)
    (store / "artifacts").mkdir()
    run_cli("--store", str(store), "study", "run", SPEC, *SMALL)
    run_cli("--store", str(store), "study", "run", SPEC, *BAD)
    return store


def _copy(studied: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(studied, tmp_path / "store"))


def _client(store: Path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{store / 'mlflow.db'}"
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _trial_runs(store: Path, study: str = STUDY) -> dict[int, object]:
    c = _client(store)
    exp = c.get_experiment_by_name(study)
    return {int(r.data.tags["optuna.trial_number"]): r for r in c.search_runs([exp.experiment_id])
            if r.data.tags.get("hpolab.role", "trial") == "trial" and "optuna.trial_number" in r.data.tags}


def _load(uri: str, store: Path):
    import mlflow
    import mlflow.pytorch

    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    try:
        return mlflow.pytorch.load_model(uri, map_location="cpu")
    finally:
        mlflow.set_tracking_uri(None)


@pytest.mark.slow
def test_promote_registers_the_trials_logged_model_gated_by_evaluate_and_predict_prints_its_outputs(studied, tmp_path):
    import torch

    from experiments.digits_own_loop import evaluate, splits
    from hpolab.registry.exported_module import as_module

    store = _copy(studied, tmp_path)
    out = run_cli("--store", str(store), "promote", "--no-race", STUDY)
    assert "does not exist yet: the challenger takes it" in out.stdout and "registered digits-own-loop version 1" in out.stdout, out.stdout
    v = _client(store).get_model_version_by_alias(STUDY, "champion")
    trial_run = _trial_runs(store)[int(v.tags["hpolab.trial_number"])]
    assert v.source == trial_run.data.tags["hpolab.model_uri"]  # the trial's logged model itself, not rebuilt
    model = as_module(_load(v.source, store))
    test = evaluate(model, "test")
    assert v.tags["hpolab.gate_metric"] == "test_acc" and float(v.tags["hpolab.test_acc"]) == pytest.approx(test["acc"])
    assert v.tags["hpolab.gate_source"] == "evaluate" and "hpolab.onnx_max_abs_diff" in v.tags, v.tags

    x = splits()["test"][0][:5].numpy()
    np.save(tmp_path / "inputs.npy", x)
    pred = run_cli("--store", str(store), "predict", f"models:/{STUDY}@champion", str(tmp_path / "inputs.npy"))
    lines = pred.stdout.strip().splitlines()
    assert lines[0].split("\t") == ["input"] + [f"output_{j}" for j in range(10)], pred.stdout
    got = np.array([[float(c) for c in line.split("\t")[1:]] for line in lines[1:]])
    with torch.inference_mode():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    again = run_cli("--store", str(store), "promote", "--no-race", STUDY)
    assert "nothing to do" in again.stdout, again.stdout


@pytest.mark.slow
def test_a_worse_own_loop_challenger_is_refused_on_the_test_metric_and_force_moves_the_alias(studied, tmp_path):
    store = _copy(studied, tmp_path)
    dry = run_cli("--store", str(store), "promote", "--no-race", STUDY, "--model-name", "digits", "--dry-run")
    assert "dry run: would register the logged model of trial" in dry.stdout and not _client(store).search_registered_models()
    run_cli("--store", str(store), "promote", "--no-race", STUDY, "--model-name", "digits")
    out = run_cli("--store", str(store), "promote", "--no-race", "digits-own-loop-bad", "--model-name", "digits", check=False)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "REFUSED" in out.stdout and "test acc" in out.stdout and "(maximize)" in out.stdout, out.stdout
    c = _client(store)
    assert str(c.get_model_version_by_alias("digits", "champion").version) == "1"
    assert len(c.search_model_versions("name = 'digits'")) == 1  # nothing written
    forced = run_cli("--store", str(store), "promote", "--no-race", "digits-own-loop-bad", "--model-name", "digits", "--force")
    assert "NOT better" in forced.stdout and str(c.get_model_version_by_alias("digits", "champion").version) == "2", forced.stdout
    # the better trial already has version 1: the gate lets it back, and no version is added
    back = run_cli("--store", str(store), "promote", "--no-race", STUDY, "--model-name", "digits")
    assert "beats champion version 2" in back.stdout and "already holds trial" in back.stdout, back.stdout
    assert str(c.get_model_version_by_alias("digits", "champion").version) == "1"
    assert len(c.search_model_versions("name = 'digits'")) == 2


@pytest.mark.slow
def test_a_routine_challenger_and_an_own_loop_champion_are_not_compared(studied, tmp_path):
    store = _copy(studied, tmp_path)
    run_cli("--store", str(store), "promote", "--no-race", STUDY, "--model-name", "digits")
    run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", "n_trials=1", "parallel=1",
            "trainer.max_epochs=1", "pruner={type: none}")
    out = run_cli("--store", str(store), "promote", "--no-race", "digits-cnn", "--model-name", "digits", check=False)
    assert out.returncode == 3 and "it was scored by its experiment's evaluate(model, split), not on this test split" in out.stdout, out.stdout


@pytest.mark.slow
def test_reproduce_reruns_the_own_loop_and_matches_every_reported_metric(studied):
    run = _trial_runs(studied)[1]
    out = run_cli("--store", str(studied), "reproduce", run.info.run_id)
    assert "reproduced: identical" in out.stdout, out.stdout
    assert "val_acc" in out.stdout.replace("\n", "") or "val_a" in out.stdout  # the loop's own metrics are compared


@pytest.mark.slow
def test_compare_report_status_and_check_show_the_own_loop_metrics(studied, tmp_path):
    rows = json.loads(run_cli("--store", str(studied), "compare", STUDY, "--format", "json").stdout)
    assert len(rows) == 3 and all(r["state"] == "COMPLETE" for r in rows), rows
    assert all(0 < r["best_val_acc"] <= 1 and r["params.model.hidden"] in (32, 64, 128) for r in rows), rows
    assert all(r["metrics.val_loss"] > 0 and r["model_uri"].startswith("models:/m-") for r in rows), rows
    report = run_cli("--store", str(studied), "report", STUDY, "--out", str(tmp_path / "report.html"))
    html = (tmp_path / "report.html").read_text()
    assert "Learning curves" in html and "val_acc" in html and "Best trial" in html, report.stdout
    status = run_cli("--store", str(studied), "study", "status", STUDY)
    assert "3 complete; best: trial" in status.stdout and "hidden" in status.stdout, status.stdout
    check = run_cli("--store", str(studied), "study", "check", STUDY, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


NO_EVALUATE_SPEC = """\
name: no-evaluate
experiment: no_evaluate_loop
metric: val_acc
direction: maximize
n_trials: 1
parallel: 1
seed: 0
pruner: {type: none}
trainer: {max_epochs: 1, batch_size: 64, lr: 3.0e-3, weight_decay: 0.01}
model: {hidden: 32, dropout: 0.0}
"""


@pytest.mark.slow
def test_without_evaluate_promote_says_to_define_it_and_force_registers_the_model_ungated(store, tmp_path):
    project = tmp_path / "project"
    (project / "experiments").mkdir(parents=True)
    (project / "studies").mkdir()
    code = (ROOT / "experiments" / "digits_own_loop.py").read_text().replace("evaluate(", "score(")
    (project / "experiments" / "no_evaluate_loop.py").write_text(code)
    (project / "studies" / "no_evaluate.yaml").write_text(NO_EVALUATE_SPEC)
    run_cli("--store", str(store), "study", "run", "studies/no_evaluate.yaml", cwd=project)
    out = run_cli("--store", str(store), "promote", "--no-race", "no-evaluate", cwd=project, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout + out.stderr
    line = [x for x in out.stderr.splitlines() if x.strip()][-1]
    assert "has no evaluate(model, split): define it" in line and "--force" in line, out.stderr
    assert not _client(store).search_registered_models()
    forced = run_cli("--store", str(store), "promote", "--no-race", "no-evaluate", "--force", cwd=project)
    assert "ungated" in forced.stdout, forced.stdout
    v = _client(store).get_model_version_by_alias("no-evaluate", "champion")
    assert v.tags["hpolab.gate_metric"] == "none" and v.tags["hpolab.gate_source"] == "none"
