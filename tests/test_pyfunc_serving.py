"""The champion travels: `mlflow.pyfunc.load_model("models:/NAME@champion")` in a fresh
`python -I` in an empty folder (hpolab and the experiments blocked from import) and `mlflow models
serve` answering a real HTTP request both give exactly what `hpolab predict` prints: for a classifier
the class, its label and one probability per class; for multi-label the 0/1 labels at the study's
threshold and the probabilities; for regression the values in the target's units. Also for a user's
project outside the repo, with its own preprocessing and class names.

One tiny study (1 trial, 2 epochs) and one promotion per task type, shared by the module's tests; the
three champions load in one isolated process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli
from services import free_port, wait_for_http

pytestmark = pytest.mark.slow

TINY = ["n_trials=1", "parallel=1", "search_space={}", "pruner={type: none}"]
CASES = {
    "classification": ("studies/digits_cnn.yaml", "digits-cnn", "digits_cnn", ["trainer.max_epochs=2"]),
    "regression": ("studies/diabetes_mlp.yaml", "diabetes-mlp", "diabetes_mlp", ["trainer.max_epochs=2"]),
    # a threshold away from the default: the served labels must use the study's
    "multilabel": ("studies/digits_multilabel.yaml", "digits-multilabel", "digits_multilabel",
                   ["trainer.max_epochs=2", "trainer.multilabel_threshold=0.3"]),
}
ROWS = 40  # raw test inputs sent over HTTP

# Loads champions the way a user elsewhere would: no project, no hpolab (imports of either fail). Each
# job: the store's tracking URI, the model URI, the inputs, where to write the table. Several jobs share
# one process (importing MLflow and torch once); `hpolab_pyfunc`, the module each model carries in its
# code/ folder, is dropped before each load, so each model loads its own copy as a fresh process would.
ISOLATED_LOAD = """
import json, sys
sys.modules["hpolab"] = None
sys.modules["experiments"] = None
import mlflow, numpy as np
code_files = []
for tracking_uri, model_uri, inputs, out in json.loads(sys.argv[1]):
    sys.modules.pop("hpolab_pyfunc", None)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    model = mlflow.pyfunc.load_model(model_uri)
    code_files.append(sys.modules["hpolab_pyfunc"].__file__)
    assert code_files[-1] not in code_files[:-1], f"{model_uri} loaded another model's code: {code_files}"
    model.predict(np.load(inputs)).to_pickle(out)
assert not any(m == "hpolab" or m.startswith(("hpolab.", "experiments")) for m in sys.modules if sys.modules[m] is not None)
"""


def _uri(store: Path) -> str:
    return f"sqlite:///{store / 'mlflow.db'}"


def _new_store(tmp_path_factory, migrated_store, name: str) -> Path:
    store = tmp_path_factory.mktemp(name) / "store"
    store.mkdir()
    for f in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / f, store / f)
    (store / "artifacts").mkdir()
    return store


@pytest.fixture(scope="module")
def champions(tmp_path_factory, migrated_store) -> dict[str, tuple]:
    """task -> (store, registered name, raw test inputs, targets, version tags), after one study and one
    promote per task type."""
    import importlib

    from mlflow import MlflowClient

    built = {}
    for task, (spec, name, module, extra) in sorted(CASES.items()):
        store = _new_store(tmp_path_factory, migrated_store, task)
        run_cli("--store", str(store), "study", "run", spec, *TINY, *extra)
        run_cli("--store", str(store), "promote", "--no-race", name)
        exp = importlib.import_module(f"experiments.{module}")
        x, y = exp.raw_test(exp.DATA_DEFAULTS, 0)
        tags = MlflowClient(tracking_uri=_uri(store)).get_model_version_by_alias(name, "champion").tags
        built[task] = store, name, x, y, tags
    return built


@pytest.fixture(scope="module")
def isolated_tables(champions, tmp_path_factory) -> dict[str, pd.DataFrame]:
    """task -> what its champion's pyfunc predicts for every raw test input, loaded by name in a fresh
    isolated interpreter in an empty folder (one process for the three models)."""
    folder = tmp_path_factory.mktemp("isolated")
    tables = _isolated_pyfunc([(store, name, x) for store, name, x, _, _ in champions.values()], folder)
    return dict(zip(champions, tables))


def _predict(store: Path, name: str, x: np.ndarray, folder: Path) -> pd.DataFrame:
    """`hpolab predict` (the real CLI) --out CSV, read back."""
    np.save(folder / "x.npy", x)
    run_cli("--store", str(store), "predict", f"models:/{name}@champion", str(folder / "x.npy"), "--out", str(folder / "p.csv"))
    return pd.read_csv(folder / "p.csv", keep_default_na=False)


def _isolated_pyfunc(models: list[tuple[Path, str, np.ndarray]], folder: Path) -> list[pd.DataFrame]:
    """For each (store, registered name, inputs): the champion's table from ISOLATED_LOAD, run by
    `python -I` in an empty folder with no PYTHONPATH and no MLflow settings in its environment."""
    empty = folder / "empty"
    empty.mkdir()
    jobs = []
    for i, (store, name, x) in enumerate(models):
        np.save(folder / f"in{i}.npy", x)
        jobs.append([_uri(store), f"models:/{name}@champion", str(folder / f"in{i}.npy"), str(folder / f"out{i}.pkl")])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", str(folder))}
    proc = subprocess.run([sys.executable, "-I", "-c", ISOLATED_LOAD, json.dumps(jobs)], cwd=empty, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [pd.read_pickle(out) for *_, out in jobs]


def _same(served: pd.DataFrame, predicted: pd.DataFrame) -> None:
    """Equal column for column: integer and text columns exactly, float32 ones bit for bit (the CSV holds
    each float32's shortest repr; JSON its float64 value)."""
    assert list(predicted.columns) == ["input", *served.columns]
    for col in served.columns:
        if served[col].dtype == np.float32:
            assert np.array_equal(predicted[col].to_numpy().astype(np.float32), served[col].to_numpy()), col
        elif pd.api.types.is_integer_dtype(served[col]):
            assert predicted[col].tolist() == served[col].tolist(), col
        else:  # label: text (a CSV reads digits' "0".."9" back as numbers)
            assert predicted[col].astype(str).tolist() == served[col].astype(str).tolist(), col


@pytest.mark.parametrize("task", sorted(CASES))
def test_pyfunc_in_an_empty_folder_equals_hpolab_predict(task, champions, isolated_tables, tmp_path):
    """Every raw test input: the isolated pyfunc's table equals predict's, says what its signature says,
    and (classification) reproduces the test accuracy promote recorded."""
    from mlflow.models import Model

    store, name, x, y, tags = champions[task]
    predicted = _predict(store, name, x, tmp_path)
    served = isolated_tables[task]
    _same(served, predicted)
    signature = Model.load(_model_dir(store, name)).signature
    assert [c.name for c in signature.outputs.inputs] == list(served.columns)

    names = json.loads(tags["hpolab.class_names"])
    if task == "classification":
        assert list(served.columns) == ["class", "label", *(f"prob_{c}" for c in names)]
        assert len(names) == int(tags["hpolab.num_classes"]) == 10
        probs = served[[f"prob_{c}" for c in names]].to_numpy()
        assert np.allclose(probs.sum(1), 1, atol=1e-5)
        assert served["class"].tolist() == probs.argmax(1).tolist()
        assert served["label"].tolist() == [names[i] for i in served["class"]]
        assert float((served["class"].to_numpy() == y).mean()) == float(tags["hpolab.test_acc"])
    elif task == "multilabel":
        threshold = float(tags["hpolab.multilabel_threshold"])
        assert threshold == 0.3 and names == ["even", "greater_than_4", "loop"]
        assert list(served.columns) == [*(f"label_{c}" for c in names), *(f"prob_{c}" for c in names)]
        for c in names:
            assert served[f"label_{c}"].tolist() == (served[f"prob_{c}"] >= threshold).astype(int).tolist()
    else:
        assert list(served.columns) == ["prediction"]
        rmse = float(np.sqrt(np.mean((served["prediction"].to_numpy(np.float64) - y) ** 2)))
        assert rmse == pytest.approx(float(tags["hpolab.test_rmse"]), rel=1e-5)
        assert 50 < served["prediction"].mean() < 300  # disease progression units (25..346), not standardized ones


def _model_dir(store: Path, name: str) -> str:
    """The local folder of the champion's model (the embedded store keeps artifacts on disk)."""
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=_uri(store), registry_uri=_uri(store))
    mv = c.get_model_version_by_alias(name, "champion")
    return c.get_logged_model(mv.source.removeprefix("models:/")).artifact_location.removeprefix("file://")


def test_mlflow_models_serve_answers_with_labels_and_probabilities(champions, tmp_path):
    store, name, x, y, tags = champions["classification"]
    predicted = _predict(store, name, x[:ROWS], tmp_path)
    empty = tmp_path / "serve"
    empty.mkdir()
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPTUNA_STORAGE")}, "MLFLOW_TRACKING_URI": _uri(store)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # an activated venv: serve execs its uvicorn
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "models", "serve", "-m", f"models:/{name}@champion",
                             "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=empty, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            wait_for_http(f"http://127.0.0.1:{port}/ping", proc, timeout=600)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{(tmp_path / 'serve.log').read_text()[-4000:]}") from None
        body = json.dumps({"inputs": x[:ROWS].tolist()}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
            answer = json.loads(response.read())
    finally:
        _stop(proc)
        log.close()
    rows = pd.DataFrame(answer["predictions"])
    names = json.loads(tags["hpolab.class_names"])
    assert list(rows.columns) == ["class", "label", *(f"prob_{c}" for c in names)]
    for c in names:
        rows[f"prob_{c}"] = rows[f"prob_{c}"].astype(np.float32)  # JSON carries each float32 as its float64 value
    _same(rows, predicted)


def _stop(proc: subprocess.Popen) -> None:
    """The server and its workers (its own process group) stop; killed if they do not within a minute."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


# ----------------------------------------------------------------------------- a user's own project

USER_EXPERIMENT = '''
"""A user's experiment outside the hpolab repo: iris flowers in centimetres, standardised by its own
preprocess (inside the served model), with its own class names."""
import numpy as np
import torch
from sklearn.datasets import load_iris
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train.data import DataSplits

DATA_DEFAULTS = {}
MODEL_DEFAULTS = {"hidden": 16}
MEAN = torch.tensor([5.84, 3.06, 3.76, 1.20])  # cm
STD = torch.tensor([0.83, 0.44, 1.77, 0.76])


def preprocess(raw):
    return (torch.as_tensor(raw, dtype=torch.float32) - MEAN) / STD


def _split(seed):
    bunch = load_iris()
    x, y = bunch.data.astype(np.float32), bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    return x, y, (np.sort(order[:90]), np.sort(order[90:120]), np.sort(order[120:])), tuple(bunch.target_names)


def load_data(data, seed):
    x, y, (tr, va, te), names = _split(seed)
    xt, yt = preprocess(torch.from_numpy(x)), torch.from_numpy(y)
    split = lambda i: TensorDataset(xt[i], yt[i])
    return DataSplits(train=split(tr), val=split(va), test=split(te), num_classes=3, input_shape=(4,),
                      class_names=names, preprocess=preprocess)


def raw_test(data, seed):
    x, y, (_, _, te), _ = _split(seed)
    return x[te], y[te]


def build_model(model, input_shape, num_classes):
    h = int(model["hidden"])
    return nn.Sequential(nn.Linear(input_shape[0], h), nn.ReLU(), nn.Linear(h, num_classes))
'''

USER_SPEC = """
name: iris-user
experiment: iris_user
metric: val_acc
direction: maximize
n_trials: 1
parallel: 1
seed: 0
sampler: {type: random}
pruner: {type: none}
trainer: {max_epochs: 3, batch_size: 16, lr: 0.01, scheduler: none, device: cpu}
model: {hidden: 16}
"""


def test_a_user_project_outside_the_repo_travels_too(tmp_path, store):
    project = tmp_path / "my-project"
    (project / "experiments").mkdir(parents=True)
    (project / "studies").mkdir()
    (project / "experiments" / "iris_user.py").write_text(textwrap.dedent(USER_EXPERIMENT))
    (project / "studies" / "iris.yaml").write_text(USER_SPEC)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_cli("--store", str(store), "study", "run", str(project / "studies" / "iris.yaml"), cwd=elsewhere)
    run_cli("--store", str(store), "promote", "--no-race", str(project / "studies" / "iris.yaml"), cwd=elsewhere)

    ns: dict = {}
    exec(compile(textwrap.dedent(USER_EXPERIMENT), "iris_user", "exec"), ns)  # noqa: S102 -- the test's own text
    x, y = ns["raw_test"]({}, 0)
    assert x.max() > 5  # raw centimetres: the served model must standardise them itself
    folder = tmp_path / "io"
    folder.mkdir()
    predicted = _predict(store, "iris-user", x, folder)
    (served,) = _isolated_pyfunc([(store, "iris-user", x)], folder)
    _same(served, predicted)
    assert list(served.columns) == ["class", "label", "prob_setosa", "prob_versicolor", "prob_virginica"]
    from mlflow import MlflowClient

    tags = MlflowClient(tracking_uri=_uri(store)).get_model_version_by_alias("iris-user", "champion").tags
    assert float((served["class"].to_numpy() == y).mean()) == float(tags["hpolab.test_acc"])
    assert set(served["label"]) <= {"setosa", "versicolor", "virginica"}
