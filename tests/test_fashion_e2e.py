"""The torchvision experiment end to end through the real CLI: a study on tiny FashionMNIST IDX
files (written in the dataset's real on-disk format), promote, and predict on a folder of PNGs."""

from __future__ import annotations

import csv
import io

import mlflow
import optuna
import pytest
from PIL import Image

from conftest import run_cli
from test_experiment_fashion_mnist import _write_fashion_mnist


@pytest.mark.slow
def test_fashion_study_promote_and_predict_on_images(store, tmp_path):
    root = tmp_path / "data"
    arrays = _write_fashion_mnist(root)
    run_cli("--store", str(store), "study", "run", "studies/fashion_mnist.yaml", "n_trials=1", "trainer.max_epochs=2",
            f"data.root={root}", "model.arch=small_cnn", "model.channels=8", "trainer.num_workers=0",
            "trainer.batch_size=16", "search_space={}", "pruner={type: none}")
    study = optuna.load_study(study_name="fashion-mnist", storage=f"sqlite:///{store / 'optuna.db'}")
    (trial,) = study.trials
    assert trial.state == optuna.trial.TrialState.COMPLETE and sorted(trial.intermediate_values) == [1, 2]

    out = run_cli("--store", str(store), "promote", "--no-race", "fashion-mnist")
    assert "champion" in out.stdout

    # a folder of real PNG files, as a user would have them
    images = tmp_path / "images"
    images.mkdir()
    for i, img in enumerate(arrays["test_x"][:5]):
        Image.fromarray(img, mode="L").save(images / f"img{i}.png")
    pred = run_cli("--store", str(store), "predict", "models:/fashion-mnist@champion", str(images))
    rows = list(csv.DictReader(io.StringIO(pred.stdout), delimiter="\t"))
    assert [r["input"] for r in rows] == [f"img{i}.png" for i in range(5)]

    # the same raw images through the registered model by alias give the same classes
    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    try:
        model = mlflow.pyfunc.load_model("models:/fashion-mnist@champion")
        served = model.predict(arrays["test_x"][:5])  # class, label, prob_<class name>
    finally:
        mlflow.set_tracking_uri(None)
    assert [int(r["class"]) for r in rows] == served["class"].tolist()
    assert [r["label"] for r in rows] == served["label"].tolist() and "prob_Ankle boot" in served.columns
