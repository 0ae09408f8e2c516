"""A new embedded store copies migrated empty databases from a per-version cache (no migrations)."""

from __future__ import annotations

import sqlite3

import optuna
from mlflow import MlflowClient

from hpolab.stores.mlflow_runs import client_for
from hpolab.stores.optuna_storage import make_storage
from hpolab.stores.paths import resolve_stores


def _schema(db) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return sorted(con.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall())
    finally:
        con.close()


def _default_experiment(db) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT artifact_location FROM experiments WHERE experiment_id = 0").fetchone()[0]
    finally:
        con.close()


def test_second_new_store_is_a_copy_with_its_own_default_location(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HPOLAB_CACHE", str(cache))
    a, b = (tmp_path / name for name in ("a", "b"))
    a.mkdir(), b.mkdir()
    client_for(resolve_stores(str(a)))
    make_storage(resolve_stores(str(a)).optuna_url).engine.dispose()
    templates = sorted(p.name for p in cache.glob("*.db"))
    assert [t.split("-")[0] for t in templates] == ["mlflow", "optuna"], templates
    made = {p: p.stat().st_mtime_ns for p in cache.glob("*.db")}

    stores_b = resolve_stores(str(b))
    client = client_for(stores_b)
    storage = make_storage(stores_b.optuna_url)
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*.db")} == made  # copied, not re-made
    assert _schema(b / "mlflow.db") == _schema(a / "mlflow.db")
    assert _schema(b / "optuna.db") == _schema(a / "optuna.db")
    assert _default_experiment(b / "mlflow.db") == (b / "artifacts").as_uri() + "/0"
    assert _default_experiment(a / "mlflow.db") == (a / "artifacts").as_uri() + "/0"

    # Both stores work as stores: an experiment and a run, a study and a trial.
    exp = client.create_experiment("x", artifact_location=stores_b.artifact_location)
    client.set_terminated(client.create_run(exp).info.run_id)
    assert MlflowClient(stores_b.tracking_uri).search_runs([exp])[0].info.status == "FINISHED"
    study = optuna.create_study(study_name="s", storage=storage)
    study.tell(study.ask(), 1.0)
    assert optuna.load_study(study_name="s", storage=stores_b.optuna_url).best_value == 1.0


def test_an_unwritable_cache_falls_back_to_creating_the_database(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("HPOLAB_CACHE", str(blocker / "cache"))
    store = tmp_path / "s"
    store.mkdir()
    client_for(resolve_stores(str(store))).search_experiments()
    make_storage(resolve_stores(str(store)).optuna_url).engine.dispose()
    assert _default_experiment(store / "mlflow.db") == (store / "artifacts").as_uri() + "/0"
    assert (store / "optuna.db").stat().st_size > 0


def _journal_mode_and_count(db, table: str) -> tuple[str, int]:
    con = sqlite3.connect(db)
    try:
        return con.execute("PRAGMA journal_mode").fetchone()[0], con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        con.close()


def test_a_new_store_logs_ahead_and_its_database_files_alone_hold_the_finished_study(tmp_path):
    """A new store's databases use SQLite's write-ahead log; the study's command copies the log into
    them as it exits, so a copy of optuna.db or mlflow.db alone (no -wal file beside it) has every
    trial and run."""
    import shutil

    from conftest import ROOT, run_cli

    store = tmp_path / "store"
    run_cli("--store", str(store), "study", "run", str(ROOT / "studies" / "bench_multifidelity.yaml"), "n_trials=2",
            "trainer.max_epochs=2", "parallel=1")
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("optuna.db", "mlflow.db"):
        shutil.copyfile(store / name, alone / name)
    assert _journal_mode_and_count(alone / "optuna.db", "trials") == ("wal", 2)
    assert _journal_mode_and_count(alone / "mlflow.db", "runs") == ("wal", 3)  # the study's run and a run per trial
