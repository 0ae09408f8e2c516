"""Both kinds of experiment, the routine's (load_data + build_model) and an own loop (train(config,
trial)), give the same results from one study: the trial's value and logged model are its best epoch's
(not its last one's), the logged model loads with mlflow.pyfunc and predicts on its input example,
`hpolab promote` registers versions and moves the alias, `hpolab reproduce` gives the same records.
One study per kind (2 trials x 4 epochs of tests/one_path.py's bias model) is shared by the module.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from optuna.trial import TrialState

from conftest import copy_store, open_study, run_cli, trial_run
from one_path import KINDS, PROJECT, assert_each_epoch_went_on_from_the_last, assert_one_curve, records, study_run

pytestmark = pytest.mark.slow

BEST_EPOCH = {0.2: 1, 0.1: 2}  # lr -> the epoch whose bias is nearest the target 0.4 (of 4)


@pytest.fixture(scope="module", params=list(KINDS))
def studied(request, tmp_path_factory, migrated_store) -> tuple[str, Path]:
    """(kind, a store with study `bias`: trials at lr 0.2 and 0.1, 4 epochs each). Read-only: copy_store it to write."""
    store = tmp_path_factory.mktemp(f"one-path-{request.param}") / "store"
    store.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, store / name)
    (store / "artifacts").mkdir()
    study_run(store, request.param)
    return request.param, store


def _trials(store: Path) -> list[tuple[object, object, dict]]:
    """(Optuna trial, its run, its records) of each trial of study `bias`."""
    client, study = open_study(store, "bias")
    return [(t, trial_run(t, client), records(client, trial_run(t, client).info.run_id)) for t in study.get_trials()]


def test_the_trials_value_and_logged_model_are_its_best_epochs_not_its_last(studied):
    _, store = studied
    found = {}
    for t, run, recorded in _trials(store):
        assert t.state == TrialState.COMPLETE and "hpolab.tell_error" not in run.data.tags, run.data.tags
        assert_one_curve(recorded, 4)
        assert_each_epoch_went_on_from_the_last(recorded)
        best = BEST_EPOCH[t.params["trainer.lr"]]
        tags = run.data.tags
        assert tags["hpolab.best_epoch"] == tags["hpolab.model_epoch"] == str(best), tags
        assert t.value == pytest.approx(dict(recorded["val_score"])[best]) and t.value > dict(recorded["val_score"])[4]
        found[t.params["trainer.lr"]] = best
    assert found == BEST_EPOCH


def test_the_logged_model_loads_with_pyfunc_and_predicts_on_its_input_example_with_its_best_epochs_weights(studied):
    import mlflow.pyfunc

    _, store = studied
    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    try:
        for t, run, recorded in _trials(store):
            model = mlflow.pyfunc.load_model(run.data.tags["hpolab.model_uri"])
            example = model.input_example
            assert example is not None and np.asarray(example).shape == (2, 4), example
            predicted = np.asarray(model.predict(example))
            best = int(run.data.tags["hpolab.model_epoch"])
            assert predicted.shape == (2, 1) and np.allclose(predicted, dict(recorded["val_pred"])[best], atol=1e-6), (predicted, recorded)
    finally:
        mlflow.set_tracking_uri(None)


def test_promote_registers_a_version_and_moves_the_alias_to_a_better_one(studied, tmp_path):
    from mlflow import MlflowClient

    kind, studied_store = studied
    store = copy_store(studied_store, tmp_path / "store")
    # a worse study of the same experiment (lr 0.05: nearest the target at its last epoch, 0.056 from it) holds the alias first
    study_run(store, kind, "name=bias-worse", "n_trials=1", "search_space={}", "sampler={type: random}", "trainer.lr=0.05")
    out = run_cli("--store", str(store), "promote", "--no-race", "bias-worse", "--model-name", "bias", cwd=PROJECT)
    assert "registered bias version 1" in out.stdout and "@champion -> version 1" in out.stdout, out.stdout
    out = run_cli("--store", str(store), "promote", "--no-race", "bias", cwd=PROJECT)
    assert "registered bias version 2" in out.stdout and "@champion -> version 2" in out.stdout, out.stdout
    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    champion = client.get_model_version_by_alias("bias", "champion")
    _, study = open_study(store, "bias")
    assert str(champion.version) == "2" and champion.tags["hpolab.trial_number"] == str(study.best_trial.number)
    assert champion.tags["hpolab.previous_champion"] == "1" and float(champion.tags["hpolab.test_score"]) > -0.01, champion.tags
    import mlflow.pyfunc

    mlflow.set_tracking_uri(uri)
    try:  # the champion serves the best trial's best epoch: its bias, 0.4
        served = np.asarray(mlflow.pyfunc.load_model("models:/bias@champion").predict(np.zeros((3, 4), np.float32)))
    finally:
        mlflow.set_tracking_uri(None)
    assert served.shape == (3, 1) and np.allclose(served, 0.4, atol=1e-6), served


def test_reproduce_gives_the_trials_records_again(studied):
    _, store = studied
    for t, run, _ in _trials(store):
        out = run_cli("--store", str(store), "reproduce", run.info.run_id, cwd=PROJECT)
        assert "reproduced: identical" in out.stdout, out.stdout
