"""`hpolab study list`, `hpolab study delete`, and a spec path wherever a study is named
(status, compare, report, delete; promote in test_store_hygiene), through the real CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, copy_store, hpolab_env, run_cli

TINY = ["n_trials=2", "trainer.max_epochs=2", "parallel=1", "log_models=none"]


def _spec(folder: Path, name: str) -> Path:
    """The demo spec under another name, in a folder without experiments/ (found from the working directory)."""
    text = (ROOT / "studies" / "digits_cnn.yaml").read_text().replace("name: digits-cnn", f"name: {name}")
    p = folder / f"{name}.yaml"
    p.write_text(text)
    return p


@pytest.fixture(scope="module")
def two_studies(tmp_path_factory, migrated_store) -> tuple[Path, Path, Path]:
    """A store with studies sc-a and sc-b (2 trials x 2 epochs each), an LR range test output of
    sc-a, and their specs. Read-only: copy_store it before writing."""
    base = tmp_path_factory.mktemp("two-studies")
    store = base / "store"
    store.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, store / name)
    (store / "artifacts").mkdir()
    specs = base / "specs"
    specs.mkdir()
    a, b = _spec(specs, "sc-a"), _spec(specs, "sc-b")
    for spec in (a, b):
        run_cli("--store", str(store), "study", "run", str(spec), *TINY)
    (store / "lr-find" / "sc-a").mkdir(parents=True)  # what `hpolab lr-find` leaves (tested in test_lr_find_cli)
    (store / "lr-find" / "sc-a" / "lr_range_test.csv").write_text("lr,loss\n")
    return store, a, b


@pytest.mark.slow
def test_list_shows_one_row_per_study(two_studies):
    store, _, _ = two_studies
    out = run_cli("--store", str(store), "study", "list")
    rows = {line.split()[1]: line.split() for line in out.stdout.splitlines() if line.startswith("│ sc-")}
    assert set(rows) == {"sc-a", "sc-b"}
    for cells in rows.values():
        cells = [c for c in cells if c != "│"]
        # study, direction, metric, complete, pruned, fail, running, paused, best, date, time
        assert cells[1:8] == ["maximize", "val_acc", "2", "0", "0", "0", "0"], cells
        assert 0 < float(cells[8]) <= 1
        assert cells[9].count("-") == 2 and cells[10].count(":") == 2  # last activity: YYYY-MM-DD HH:MM:SS


def test_list_of_an_empty_store_says_so_and_creates_nothing(tmp_path):
    out = run_cli("--store", str(tmp_path / "none"), "study", "list")
    assert "no studies in" in out.stdout
    assert not (tmp_path / "none").exists()


@pytest.mark.slow
def test_a_spec_path_names_its_study_in_status_compare_and_report(two_studies, tmp_path):
    store, a, _ = two_studies
    store = copy_store(store, tmp_path / "store")  # report writes STORE/reports/
    out = run_cli("--store", str(store), "study", "status", str(a))
    assert "study sc-a (maximize)" in out.stdout
    out = run_cli("--store", str(store), "compare", str(a), "--format", "csv")
    assert len(out.stdout.strip().splitlines()) == 3  # header + 2 trials
    run_cli("--store", str(store), "report", str(a))
    assert (store / "reports" / "sc-a.html").is_file()
    # a path that is not a file is a name like any other
    out = run_cli("--store", str(store), "study", "status", str(tmp_path / "missing.yaml"), check=False)
    assert out.returncode == 2 and "no study named" in out.stderr and "sc-a" in out.stderr


@pytest.mark.slow
def test_a_spec_without_a_name_is_one_clear_error(two_studies, tmp_path):
    store, _, _ = two_studies
    bad = tmp_path / "noname.yaml"
    bad.write_text("experiment: digits_cnn\n")
    out = run_cli("--store", str(store), "study", "status", str(bad), check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "name: missing" in out.stderr


@pytest.mark.slow
def test_delete_removes_one_study_and_leaves_the_other(two_studies, tmp_path):
    from mlflow import MlflowClient

    store, a, _ = two_studies
    store = copy_store(store, tmp_path / "store")
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    exp_a = client.get_experiment_by_name("sc-a").experiment_id
    exp_b = client.get_experiment_by_name("sc-b").experiment_id
    runs_b = {r.info.run_id for r in client.search_runs([exp_b])}

    out = run_cli("--store", str(store), "study", "delete", str(a), "--yes")  # by spec
    assert "soft delete" in out.stdout

    listing = run_cli("--store", str(store), "study", "list").stdout
    assert "sc-b" in listing and "sc-a" not in listing
    assert client.get_experiment(exp_a).lifecycle_stage == "deleted"
    assert client.get_experiment_by_name("sc-a") is None  # the name is free for a new study
    assert not (store / "trials" / "sc-a").exists() and not (store / "lr-find" / "sc-a").exists()
    # sc-b: its Optuna trials, MLflow experiment, runs and checkpoints are all still there
    assert client.get_experiment(exp_b).lifecycle_stage == "active"
    assert {r.info.run_id for r in client.search_runs([exp_b])} == runs_b
    assert sorted(p.name for p in (store / "trials" / "sc-b").iterdir()) == ["trial-0", "trial-1"]
    assert "study sc-b" in run_cli("--store", str(store), "study", "status", "sc-b").stdout


@pytest.mark.slow
def test_delete_refuses_unknown_studies_and_asks_before_deleting(two_studies, tmp_path):
    store, _, _ = two_studies
    out = run_cli("--store", str(store), "study", "delete", "nope", "--yes", check=False)
    assert out.returncode == 2 and "no study named 'nope'" in out.stderr and "sc-a, sc-b" in out.stderr
    # no terminal to ask on and no --yes: refuse, delete nothing
    out = run_cli("--store", str(store), "study", "delete", "sc-a", check=False)
    assert out.returncode == 2 and "pass --yes" in out.stderr and "Traceback" not in out.stderr
    # on a terminal: asks; anything but y/yes keeps the study
    exe = Path(sys.executable).with_name("hpolab")
    master, slave = os.openpty()
    try:
        os.write(master, b"n\n")
        proc = subprocess.run([str(exe), "--store", str(store), "study", "delete", "sc-a"], stdin=slave,
                              capture_output=True, text=True, env=hpolab_env(), timeout=120)
    finally:
        os.close(slave)
        os.close(master)
    assert proc.returncode == 0, proc.stderr
    assert "[y/N]" in proc.stdout and "nothing deleted" in proc.stdout
    assert "sc-a" in run_cli("--store", str(store), "study", "list").stdout


@pytest.mark.slow
def test_delete_renames_an_experiment_already_deleted_and_warns_of_registered_versions(two_studies, tmp_path):
    """The experiment was deleted in the MLflow UI first: `study delete` still frees its name (else the
    next `study run` restores it, old runs and all, and their trial numbers collide with the new ones),
    and says which registered versions have their source run in it."""
    from mlflow import MlflowClient

    store, a, _ = two_studies
    store = copy_store(store, tmp_path / "store")
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}", registry_uri=f"sqlite:///{store / 'mlflow.db'}")
    old = client.get_experiment_by_name("sc-a")
    run_id = client.search_runs([old.experiment_id], "tags.`hpolab.state` = 'COMPLETE'")[0].info.run_id
    client.create_registered_model("sc-a-model")  # a version whose source run is a run of the study, as promote makes
    client.create_model_version("sc-a-model", source=f"runs:/{run_id}/model", run_id=run_id)
    client.delete_experiment(old.experiment_id)  # as the MLflow UI does

    out = run_cli("--store", str(store), "study", "delete", "sc-a", "--yes")
    assert client.get_experiment(old.experiment_id).lifecycle_stage == "deleted"
    assert client.get_experiment(old.experiment_id).name.startswith("sc-a.deleted-")
    warnings = [line for line in out.stderr.splitlines() if "sc-a-model" in line]
    assert len(warnings) == 1 and "version 1" in warnings[0] and "warning" in warnings[0], out.stderr

    run_cli("--store", str(store), "study", "run", str(a), *TINY)
    new = client.get_experiment_by_name("sc-a")
    assert new.experiment_id != old.experiment_id and new.lifecycle_stage == "active"
    assert len(client.search_runs([new.experiment_id], "tags.`hpolab.role` = 'trial'")) == 2
    checked = run_cli("--store", str(store), "study", "check", "sc-a", check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
