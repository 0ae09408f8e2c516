"""`hpolab promote` / `hpolab predict` against the real MLflow registry on the embedded SQLite store
(the serving model itself, without a registry: tests/test_serving_model.py).

Two tiny studies are run once per module with the real CLI (`digits-cnn`: 2 trials x 3 epochs;
`digits-bad`: 1 trial, 1 epoch at lr 1e-6, a deliberately worse challenger). Each test works on a
copy of that store. (The copies share the template's artifacts/ folder: MLflow records absolute
artifact locations. Run ids are unique, so tests never see each other's files through the DB.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
from mlflow import MlflowClient

from conftest import run_cli

# Tests that read the studied store (a real study, about a minute once) are slow; pure ones are not.

DIGITS = ["n_trials=2", "parallel=2", "trainer.max_epochs=3", "pruner={type: none}"]
BAD = ["name=digits-bad", "n_trials=1", "parallel=1", "trainer.max_epochs=1", "trainer.lr=1e-6", "search_space={}", "pruner={type: none}"]


@pytest.fixture(autouse=True)
def _no_ambient_stores(monkeypatch):
    """In-process calls resolve stores from --store only: no tracking URI left over by another test
    (mlflow.set_tracking_uri also exports MLFLOW_TRACKING_URI)."""
    import mlflow

    mlflow.set_tracking_uri(None)
    for var in ("MLFLOW_TRACKING_URI", "OPTUNA_STORAGE", "HPOLAB_STORE"):
        monkeypatch.delenv(var, raising=False)
    yield
    mlflow.set_tracking_uri(None)


def _uri(store: Path) -> str:
    return f"sqlite:///{store / 'mlflow.db'}"


def _client(store: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=_uri(store), registry_uri=_uri(store))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _registry(store: Path) -> dict:
    """Everything promote could write: registered models, versions with tags and aliases, runs."""
    c = _client(store)
    models = {m.name: sorted(m.aliases.items()) if isinstance(m.aliases, dict) else m.aliases for m in c.search_registered_models()}
    versions = sorted((v.name, v.version, tuple(sorted(v.tags.items()))) for v in c.search_model_versions())
    runs = sorted(r.info.run_id for e in c.search_experiments() for r in c.search_runs([e.experiment_id]))
    return {"models": models, "versions": versions, "runs": runs}


def _raw_test():
    from experiments import digits_cnn

    return digits_cnn.raw_test(digits_cnn.DATA_DEFAULTS, 0)


@pytest.fixture(scope="module")
def studied(tmp_path_factory, migrated_store) -> Path:
    store = tmp_path_factory.mktemp("promote") / "studied"
    store.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, store / name)
    (store / "artifacts").mkdir()
    run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", *DIGITS)
    run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", *BAD)
    return store


@pytest.fixture(scope="module")
def promoted(studied, tmp_path_factory):
    """The studied store after `hpolab promote digits-cnn`: (store, the CLI's completed process)."""
    store = _copy(studied, tmp_path_factory.mktemp("promoted") / "store")
    out = run_cli("--store", str(store), "promote", "--no-race", "digits-cnn")
    return store, out


@pytest.fixture
def champion_store(promoted, tmp_path) -> Path:
    return _copy(promoted[0], tmp_path / "store")


def _promote(capsys, store: Path, *args: str) -> tuple[int, str]:
    """`hpolab promote` in this process (torch and MLflow already imported: seconds faster than the CLI)."""
    from hpolab import cli

    code = cli.main(["--store", str(store), "promote", "--no-race", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _best_trial(store: Path, name: str = "digits-cnn") -> optuna.trial.FrozenTrial:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{store / 'optuna.db'}").best_trial


# ----------------------------------------------------------------------------- promote


@pytest.mark.slow
def test_dry_run_writes_nothing(studied, tmp_path, capsys):
    store = _copy(studied, tmp_path / "store")
    before = _registry(store)
    files_before = sorted(p for p in (studied / "artifacts").rglob("*"))
    code, out = _promote(capsys, store, "digits-cnn", "--dry-run")
    assert code == 0, out
    assert "dry run: would register a new version of digits-cnn" in out
    assert "test_acc" in out and "ONNX" in out and "max abs diff" in out
    assert _registry(store) == before
    assert before["models"] == {}
    assert sorted(p for p in (studied / "artifacts").rglob("*")) == files_before


@pytest.mark.slow
def test_promote_registers_the_best_trial_with_lineage_alias_and_exports(promoted):
    store, out = promoted
    c = _client(store)
    best = _best_trial(store)
    run_id = best.user_attrs["mlflow_run_id"]

    mv = c.get_model_version_by_alias("digits-cnn", "champion")
    assert str(mv.version) == "1"
    tags = mv.tags
    assert tags["hpolab.study"] == "digits-cnn"
    assert tags["hpolab.trial_number"] == str(best.number)
    assert tags["hpolab.trial_run_id"] == run_id
    assert float(tags["hpolab.val_acc"]) == pytest.approx(best.value)
    assert tags["hpolab.previous_champion"] == "none"
    assert tags["hpolab.experiment"] == "digits_cnn"
    assert tags["hpolab.gate_metric"] == "test_acc"
    assert json.loads(tags["hpolab.raw_input_shape"]) == [8, 8] and tags["hpolab.raw_input_dtype"] == "float32"
    for key in ("env.torch", "env.mlflow", "env.optuna", "env.python", "env.git_commit"):
        assert tags[key], key
    assert tags["env.git_commit"] == c.get_run(run_id).data.tags["env.git_commit"]
    test_acc = float(tags["hpolab.test_acc"])
    assert 0.0 <= test_acc <= 1.0 and int(tags["hpolab.test_n"]) == len(_raw_test()[1])

    # the output shows the test metrics next to the validation metric
    assert "val_acc" in out.stdout and "test_acc" in out.stdout
    assert f"{test_acc:.4f}" in out.stdout and f"{best.value:.4f}" in out.stdout
    assert "@champion -> version 1" in out.stdout

    # the version's run: promote-trial-<n>, nested under the study's parent run, with the exports
    run = c.get_run(mv.run_id)
    study = optuna.load_study(study_name="digits-cnn", storage=f"sqlite:///{store / 'optuna.db'}")
    assert run.info.run_name == f"promote-trial-{best.number}" and run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == study.user_attrs["mlflow_parent_run_id"]
    assert run.data.metrics["test_acc"] == test_acc
    assert {a.path for a in c.list_artifacts(mv.run_id, "export")} == {"export/model.onnx", "export/model.torchscript.pt"}
    assert mv.source.startswith("models:/m-")  # the serving model: a LoggedModel of the promote run
    served = c.get_logged_model(mv.source.removeprefix("models:/"))
    assert served.source_run_id == mv.run_id and served.tags["hpolab.experiment"] == "digits_cnn"

    # ONNX parity recorded, and true: the exported file run with onnxruntime on other batch sizes
    onnx_diff = float(tags["hpolab.onnx_max_abs_diff"])
    assert 0.0 <= onnx_diff <= 1e-4
    import onnxruntime as ort

    local = Path(c.download_artifacts(mv.run_id, "export", str(store / "dl")))
    session = ort.InferenceSession(str(local / "model.onnx"), providers=["CPUExecutionProvider"])
    assert not isinstance(session.get_inputs()[0].shape[0], int)  # dynamic batch axis
    x, _ = _raw_test()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load is deprecated in torch >= 2.10
        ts = torch.jit.load(str(local / "model.torchscript.pt"))
    import mlflow.pytorch

    mlflow.set_tracking_uri(_uri(store))  # reset by _no_ambient_stores
    pt = mlflow.pytorch.load_model(f"models:/{mv.name}/{mv.version}")
    for n in (1, 7):
        ref = pt(torch.from_numpy(x[:n])).detach().numpy()
        assert np.abs(session.run(None, {session.get_inputs()[0].name: x[:n]})[0] - ref).max() <= 1e-4
        assert np.abs(ts(torch.from_numpy(x[:n])).detach().numpy() - ref).max() <= 1e-4


@pytest.mark.slow
def test_champion_loads_by_alias_and_reproduces_the_test_accuracy(promoted):
    import mlflow
    import mlflow.pytorch

    store, _ = promoted
    mv = _client(store).get_model_version_by_alias("digits-cnn", "champion")
    x, y = _raw_test()
    mlflow.set_tracking_uri(_uri(store))
    try:
        pyfunc = mlflow.pyfunc.load_model("models:/digits-cnn@champion")
        acc = float((pyfunc.predict(x)["class"].to_numpy() == y).mean())
        assert acc == float(mv.tags["hpolab.test_acc"])  # exactly: preprocessing is inside the model
        model = mlflow.pytorch.load_model("models:/digits-cnn@champion")
        with torch.no_grad():
            acc_pt = float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())
        assert acc_pt == acc
    finally:
        mlflow.set_tracking_uri(None)


@pytest.mark.slow
def test_promoting_the_same_run_twice_creates_no_second_version(champion_store, capsys):
    code, out = _promote(capsys, champion_store, "digits-cnn")
    assert code == 0 and "already version 1" in out
    assert [str(v.version) for v in _client(champion_store).search_model_versions("name = 'digits-cnn'")] == ["1"]


@pytest.mark.slow
def test_a_worse_challenger_is_refused_force_moves_the_alias(champion_store, capsys):
    store = champion_store
    before = _registry(store)
    refused = run_cli("--store", str(store), "promote", "--no-race", "digits-bad", "--model-name", "digits-cnn", check=False)
    assert refused.returncode == 3, refused.stdout + refused.stderr  # the real exit status
    assert "REFUSED" in refused.stdout and "not better" in refused.stdout
    assert _registry(store) == before  # nothing written: no version, no run, alias unchanged

    code, out = _promote(capsys, store, "digits-bad", "--model-name", "digits-cnn", "--force")
    assert code == 0 and "--force" in out, out
    c = _client(store)
    mv = c.get_model_version_by_alias("digits-cnn", "champion")
    assert str(mv.version) == "2"
    assert mv.tags["hpolab.previous_champion"] == "1" and mv.tags["hpolab.study"] == "digits-bad"
    assert float(mv.tags["hpolab.test_acc"]) < float(c.get_model_version("digits-cnn", "1").tags["hpolab.test_acc"])

    # the better trial wins the alias back, by its existing version (no third version)
    code, out = _promote(capsys, store, "digits-cnn")
    assert code == 0 and "no new version" in out, out
    assert str(c.get_model_version_by_alias("digits-cnn", "champion").version) == "1"
    assert sorted(str(v.version) for v in c.search_model_versions("name = 'digits-cnn'")) == ["1", "2"]
    assert c.get_model_version("digits-cnn", "1").tags["hpolab.previous_champion"] == "2"


@pytest.mark.slow
def test_a_champion_tested_on_another_split_is_not_compared(champion_store, capsys):
    c = _client(champion_store)
    c.set_model_version_tag("digits-cnn", "1", "hpolab.test_fingerprint", "0" * 64)  # as if promoted with seed 1
    c.set_model_version_tag("digits-cnn", "1", "hpolab.seed", "1")
    before = _registry(champion_store)
    code, out = _promote(capsys, champion_store, "digits-bad", "--model-name", "digits-cnn")
    assert code == 3 and "cannot be compared" in out and "test split differs" in out, out
    assert _registry(champion_store) == before


@pytest.mark.slow
def test_bad_input_exits_2_and_failed_onnx_parity_exits_1(studied, tmp_path, monkeypatch, capsys):
    from hpolab import cli

    store = _copy(studied, tmp_path / "store")
    assert cli.main(["--store", str(store), "promote", "--no-race", "no-such-study"]) == 2
    assert "no study named 'no-such-study'" in capsys.readouterr().err
    assert cli.main(["--store", str(store), "promote", "--no-race", "digits-cnn", "--metric", "val_nope_acc"]) == 2
    assert "no COMPLETE trial" in capsys.readouterr().err

    before = _registry(store)
    monkeypatch.setattr("hpolab.registry.export.ONNX_TOLERANCE", -1.0)  # any difference, even 0, now fails
    code, out = _promote(capsys, store, "digits-cnn")
    assert code == 1 and "ONNX parity" in out, out
    assert _registry(store) == before


@pytest.mark.slow
def test_metric_option_selects_by_another_logged_metric(studied, tmp_path, capsys):
    from hpolab import cli

    store = _copy(studied, tmp_path / "store")
    assert cli.main(["--store", str(store), "promote", "--no-race", "digits-cnn", "--metric", "val_loss", "--dry-run"]) == 0
    out = capsys.readouterr().out
    c = _client(store)
    study = optuna.load_study(study_name="digits-cnn", storage=f"sqlite:///{store / 'optuna.db'}")

    def loss_at_best(t):
        run = c.get_run(t.user_attrs["mlflow_run_id"])
        return [m.value for m in c.get_metric_history(run.info.run_id, "val_loss") if str(m.step) == run.data.tags["hpolab.best_epoch"]][0]

    best = min(study.trials, key=loss_at_best)
    assert f"best by val_loss (minimize at each trial's best-checkpoint epoch): trial {best.number}" in out
    assert "test_loss" in out


def test_the_gate_is_strict_and_breaks_exact_ties_on_a_second_test_metric():
    from hpolab.registry.gate import better as _better

    champ = {"acc": 1.0, "loss": 0.05, "macro_f1": 1.0}
    assert not _better(dict(champ), champ, "acc")  # equal is not better
    assert _better({**champ, "loss": 0.04}, champ, "acc")  # tied accuracy, lower loss
    assert not _better({"acc": 0.99, "loss": 0.01, "macro_f1": 0.99}, champ, "acc")
    assert _better({**champ, "loss": 0.04}, champ, "loss") and not _better({**champ, "loss": 0.06}, champ, "loss")


# ----------------------------------------------------------------------------- predict


@pytest.mark.slow
def test_predict_cli_matches_the_champion(promoted, tmp_path):
    import mlflow

    store, _ = promoted
    x, y = _raw_test()
    np.save(tmp_path / "x.npy", x.astype(np.float64))  # cast to the model's float32 by predict
    out = run_cli("--store", str(store), "predict", "models:/digits-cnn@champion", str(tmp_path / "x.npy"), "--out", str(tmp_path / "p.npy"))
    assert "wrote" in out.stderr
    preds = np.load(tmp_path / "p.npy")
    mlflow.set_tracking_uri(_uri(store))
    try:
        expected = mlflow.pyfunc.load_model("models:/digits-cnn@champion").predict(x)["class"].to_numpy()
    finally:
        mlflow.set_tracking_uri(None)
    assert preds.dtype == np.int64 and np.array_equal(preds, expected)
    tags = _client(store).get_model_version_by_alias("digits-cnn", "champion").tags
    assert float((preds == y).mean()) == float(tags["hpolab.test_acc"])


@pytest.mark.slow
def test_predict_prints_csv_and_rejects_what_the_model_cannot_take(promoted, tmp_path, capsys):
    from hpolab.errors import UserError
    from hpolab.registry.predict import predict_cmd
    from hpolab.stores.paths import resolve_stores

    store, _ = promoted
    stores = resolve_stores(str(store))
    x, _ = _raw_test()
    np.save(tmp_path / "one.npy", x[0])  # a single sample, no batch axis

    def args(inp, out=None):
        return argparse.Namespace(model_uri="models:/digits-cnn/1", input=str(inp), out=out)

    assert predict_cmd(args(tmp_path / "one.npy"), stores) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    probs = [f"prob_{c}" for c in range(10)]  # digits declares class names "0".."9"
    assert lines[0].split("\t") == ["input", "class", "label", *probs] and len(lines) == 2
    assert predict_cmd(args(tmp_path / "one.npy", str(tmp_path / "p.csv")), stores) == 0
    assert (tmp_path / "p.csv").read_text().splitlines()[0] == ",".join(["input", "class", "label", *probs])

    np.save(tmp_path / "wrong.npy", np.zeros((3, 28, 28), np.float32))
    with pytest.raises(UserError, match="shape"):
        predict_cmd(args(tmp_path / "wrong.npy"), stores)
    (tmp_path / "imgs").mkdir()
    with pytest.raises(UserError, match="not uint8 images"):
        predict_cmd(args(tmp_path / "imgs"), stores)


# ----------------------------------------------------------------------------- promote runs are no trial runs


def _run_state(store: Path) -> dict:
    """Every run of the store: (status, lifecycle stage, tags)."""
    c = _client(store)
    from mlflow.entities import ViewType

    return {r.info.run_id: (r.info.status, r.info.lifecycle_stage, sorted(r.data.tags.items()))
            for e in c.search_experiments() for r in c.search_runs([e.experiment_id], run_view_type=ViewType.ALL)}


@pytest.mark.slow
def test_study_check_after_promote_is_clean_and_repair_changes_nothing(promoted, tmp_path):
    store = _copy(promoted[0], tmp_path / "store")
    checked = run_cli("--store", str(store), "study", "check", "digits-cnn", check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "2 trial runs" in checked.stdout  # the promote run is not counted as one
    before = _run_state(store)
    repaired = run_cli("--store", str(store), "study", "check", "digits-cnn", "--repair", check=False)
    assert repaired.returncode == 0 and "repaired" not in repaired.stdout, repaired.stdout + repaired.stderr
    assert _run_state(store) == before


@pytest.mark.slow
def test_a_study_run_leaves_an_open_promote_run_alone(studied, tmp_path):
    """A promote run still being written (RUNNING, named after a trial whose driver is gone) while a
    driver opens and closes the study: the driver's repair of orphan trial runs must not touch it."""
    from types import SimpleNamespace

    from hpolab.registry.writer import _create_promote_run

    store = _copy(studied, tmp_path / "store")
    c = _client(store)
    best = _best_trial(store)
    study = optuna.load_study(study_name="digits-cnn", storage=f"sqlite:///{store / 'optuna.db'}")
    info = SimpleNamespace(experiment_id=c.get_experiment_by_name("digits-cnn").experiment_id,
                           parent_run_id=study.user_attrs["mlflow_parent_run_id"], name="digits-cnn")
    run_id = _create_promote_run(c, "digits-cnn", info, SimpleNamespace(trial_number=best.number, run_id=best.user_attrs["mlflow_run_id"]))
    before = c.get_run(run_id)
    # the budget is spent: the driver opens the study (repairing), runs nothing and closes it (repairing again)
    run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", *DIGITS)
    after = c.get_run(run_id)
    assert after.info.lifecycle_stage == "active" and after.info.status == "RUNNING"
    assert after.data.tags == before.data.tags


@pytest.mark.slow
def test_study_delete_warns_of_the_promoted_version_whose_source_run_it_deletes(promoted, tmp_path):
    store = _copy(promoted[0], tmp_path / "store")
    out = run_cli("--store", str(store), "study", "delete", "digits-cnn", "--yes")
    warnings = [line for line in out.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "digits-cnn version 1 has its source run in deleted MLflow experiment" in warnings[0], out.stderr
    assert "registered models and their versions are kept" in out.stdout
    assert str(_client(store).get_model_version("digits-cnn", "1").version) == "1"  # kept


@pytest.mark.parametrize("dry", [True, False])
def test_a_trial_that_already_has_a_version_gets_the_alias_back_without_a_new_one(store, capsys, dry):
    """The one move to an existing version that promote takes for every experiment (routine or own loop)."""
    from hpolab.errors import EXIT_OK
    from hpolab.registry.writer import TAG_PREVIOUS, move_to_existing

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}", registry_uri=f"sqlite:///{store / 'mlflow.db'}")
    client.create_registered_model("m")
    for _ in range(2):
        client.create_model_version("m", source=(store / "artifacts").as_uri())
    client.set_registered_model_alias("m", "champion", "2")
    assert move_to_existing(client, "m", "champion", "1", "2", 3, "r" * 32, dry) == EXIT_OK
    out = capsys.readouterr().out
    holder = str(client.get_model_version_by_alias("m", "champion").version)
    if dry:
        assert holder == "2" and out.startswith("dry run: would move @champion to the existing version 1 of m"), out
    else:
        assert holder == "1" and client.get_model_version("m", "1").tags[TAG_PREVIOUS] == "2"
        assert out.strip() == f"m version 1 already holds trial 3 (run {'r' * 32}): no new version; @champion -> version 1 (was version 2)"
    assert len(client.search_model_versions("name = 'm'")) == 2
