"""`study list` of an embedded store reads Optuna's SQLite database with plain SQL (no Optuna
import); it must give exactly the rows the Optuna reader gives, and fall back to it otherwise."""

from __future__ import annotations

import subprocess
import sys

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from conftest import ROOT, hpolab_env, run_cli
from hpolab.stores.optuna_sql import read_studies
from hpolab.stores.paths import resolve_stores
from hpolab.stores.studies import _rows_from_optuna, _rows_from_sql
from hpolab.study.objectives.ranking import best, front

DIST = {"x": FloatDistribution(0, 1)}


def _add(study, state, values=None, attrs=None):
    study.add_trial(create_trial(state=state, values=values, params={"x": 0.5}, distributions=DIST, system_attrs=attrs))


def _store(root):
    (root / "store").mkdir()
    url = f"sqlite:///{root / 'store' / 'optuna.db'}"
    one = optuna.create_study(storage=url, study_name="one-max", direction="maximize")
    one.set_user_attr("metric", "val_acc")
    for v in (0.5, 0.9, 0.9, 0.7):
        _add(one, TrialState.COMPLETE, [v])
    _add(one, TrialState.COMPLETE, [0.99], {"hpolab.imported_from": "older"})  # a warm start's: no result here
    _add(one, TrialState.PRUNED)
    _add(one, TrialState.FAIL)
    one.ask()  # RUNNING
    one.enqueue_trial({"x": 0.1})  # WAITING
    low = optuna.create_study(storage=url, study_name="a-min", direction="minimize")
    _add(low, TrialState.COMPLETE, [float("inf")])
    _add(low, TrialState.COMPLETE, [float("-inf")])
    multi = optuna.create_study(storage=url, study_name="pareto", directions=["maximize", "minimize"])
    multi.set_metric_names(["val_acc", "latency_ms"])
    multi.set_user_attr("metric", "val_acc")
    for values, c in (([0.9, 1.0], [0.0]), ([0.95, 2.0], [0.0]), ([0.99, 0.5], [3.0]), ([0.8, 3.0], [0.0])):
        _add(multi, TrialState.COMPLETE, values, {"constraints": c})  # Optuna's old list format
    _add(multi, TrialState.COMPLETE, [0.999, 0.1], {"constraints:params <= 20000": 5.0})  # named (trial.set_constraint)
    optuna.create_study(storage=url, study_name="pareto~pruning")  # a companion: never listed
    optuna.create_study(storage=url, study_name="empty", directions=["minimize", "minimize"])
    return resolve_stores(str(root / "store")), root / "store" / "optuna.db"


def test_plain_sql_rows_equal_optunas(tmp_path, monkeypatch):
    import time

    stores, db = _store(tmp_path)
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # Optuna stores UTC and shows local time: so must the SQL reader
    time.tzset()
    try:
        sql = _rows_from_sql(stores, read_studies(db), front, best)
        assert sql == _rows_from_optuna(stores, front, best)
    finally:
        monkeypatch.undo()
        time.tzset()
    by_name = {r.name: r for r in sql}
    assert list(by_name) == ["a-min", "empty", "one-max", "pareto"]
    assert by_name["one-max"].best_value == 0.9 and by_name["one-max"].counts == \
        {"complete": 4, "pruned": 1, "fail": 1, "running": 1, "paused": 0, "waiting": 1, "retried": 0, "finished": 6, "imported": 1}
    assert by_name["a-min"].best_value == float("-inf")
    assert by_name["pareto"].front_size == 2 and by_name["pareto"].objectives == ["val_acc", "latency_ms"]
    assert by_name["empty"].front_size is None and by_name["empty"].last_activity is None


def test_an_unknown_schema_falls_back_to_optuna(tmp_path):
    import sqlite3

    _, db = _store(tmp_path)
    con = sqlite3.connect(db)
    with con:
        con.execute("UPDATE alembic_version SET version_num = 'v9.9.9'")
    con.close()
    assert read_studies(db) is None
    assert read_studies(tmp_path / "missing.db") is None


def test_study_list_imports_no_optuna(tmp_path):
    """The CLI's `study list` on an embedded store of one-objective studies never imports Optuna."""
    (tmp_path / "store").mkdir()
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'store' / 'optuna.db'}", study_name="one-max", direction="maximize")
    study.set_user_attr("metric", "val_acc")
    _add(study, TrialState.COMPLETE, [0.875])
    code = ("import sys, runpy; sys.argv = ['hpolab', '--store', sys.argv[1], 'study', 'list']\n"
            "try:\n    runpy.run_module('hpolab.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('OPTUNA' if 'optuna' in sys.modules else 'NO-OPTUNA')")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "store")], capture_output=True, text=True,
                         env=hpolab_env(), cwd=ROOT, check=True).stdout
    assert "one-max" in out and "0.875" in out and "val_acc" in out
    assert out.strip().endswith("NO-OPTUNA")


def _mixed_params_study(url):
    from optuna.distributions import CategoricalDistribution, IntDistribution

    study = optuna.create_study(storage=url, study_name="status-one", direction="minimize")
    dists = {"trainer.lr": FloatDistribution(1e-4, 1e-1, log=True), "model.depth": IntDistribution(1, 4),
             "model.act": CategoricalDistribution(["relu", "gelu", None]), "model.width": CategoricalDistribution([8, 16.0, 32])}
    rows = [({"trainer.lr": 0.003, "model.depth": 2, "model.act": "gelu", "model.width": 16.0}, TrialState.COMPLETE, [0.25], None),
            ({"trainer.lr": 0.01, "model.depth": 3, "model.act": None, "model.width": 32}, TrialState.COMPLETE, [0.25], None),
            ({"trainer.lr": 0.02, "model.depth": 1, "model.act": "relu", "model.width": 8}, TrialState.COMPLETE, [0.1],
             {"constraints:params <= 1000": 4.0}),  # infeasible: never best
            ({"trainer.lr": 0.05, "model.depth": 4, "model.act": "relu", "model.width": 8}, TrialState.COMPLETE, [0.05],
             {"hpolab.imported_from": "older"}),  # imported: never best
            ({"trainer.lr": 0.001}, TrialState.PRUNED, None, None),
            ({}, TrialState.FAIL, None, None)]
    for params, state, values, attrs in rows:
        t = create_trial(state=state, values=values, params=params, distributions={k: dists[k] for k in params},
                         system_attrs=attrs, user_attrs={"mlflow_run_id": f"run{len(params)}"} if params else None,
                         intermediate_values={1: 0.5, 2: 0.4} if state != TrialState.FAIL else None)  # (epochs: 1-based)
        study.add_trial(t)
    study.ask()


def test_study_status_reads_plain_sql_and_prints_what_optuna_gives(tmp_path, capsys, monkeypatch):
    from hpolab.analysis import status

    stores, _ = _store(tmp_path)
    _mixed_params_study(stores.optuna_url)
    for name in ("one-max", "a-min", "status-one"):
        assert status._read_sql(name, stores) is not None
        status.print_status(name, stores)
        sql = capsys.readouterr().out
        with monkeypatch.context() as m:
            m.setattr(status, "_read_sql", lambda *a: None)  # the Optuna reader, on the same database
            status.print_status(name, stores)
        assert sql == capsys.readouterr().out, name
    status.print_status("status-one", stores)
    out = capsys.readouterr().out
    assert "best: trial 0 value 0.25" in out and "│ gelu │     2 │    16 │ 0.003 │      2 │ run4" in out
    assert status._read_sql("no-such-study", stores) is None  # Optuna's reader names the studies there


def test_status_of_a_large_study_shows_the_best_running_and_latest_unless_all(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name="big", direction="maximize")
    for i in range(60):
        _add(study, TrialState.COMPLETE, [(i * 37 % 60) / 60])  # every value once, in a scrambled order
    study.ask()  # trial 60 RUNNING
    out = run_cli("--store", str(store), "study", "status", "big", cwd=tmp_path).stdout
    shown = {int(line.split("│")[1]) for line in out.splitlines() if line.startswith("│")}
    best20 = {t.number for t in sorted(study.get_trials(states=(TrialState.COMPLETE,)), key=lambda t: -t.value)[:20]}
    assert shown == best20 | set(range(51, 61))  # the 20 best, the running one, the 10 latest
    assert f"{len(shown)} of 61 trials shown" in out and "--all shows every trial" in out
    assert "60 complete, 1 running; best: trial" in out  # the summary counts every trial
    every = run_cli("--store", str(store), "study", "status", "big", "--all", cwd=tmp_path).stdout
    assert {int(line.split("│")[1]) for line in every.splitlines() if line.startswith("│")} == set(range(61))
    assert "trials shown" not in every


def test_the_rows_shown_of_a_large_study_are_its_own_feasible_best():
    from hpolab.analysis.status import _best_row, shown_rows
    from hpolab.stores.optuna_sql import TrialRow

    imported = [TrialRow(i, "COMPLETE", 0.99, {}, 1, None, {"hpolab.imported_from": "older"}) for i in range(30)]
    infeasible = [TrialRow(30, "COMPLETE", 0.995, {}, 1, None, {"constraints:params": 2.0})]
    own = [TrialRow(31 + i, "COMPLETE", 0.5 + i / 100, {}, 1, None, {}) for i in range(40)]
    rows = imported + infeasible + own
    shown = {r.number for r in shown_rows(rows, "maximize", 50)}
    assert _best_row(rows, "maximize") == (70, 0.89)
    assert shown == set(range(51, 71))  # the 20 best own, feasible trials (the 10 latest are among them)


def test_a_sqlite_url_with_a_query_names_the_same_file(tmp_path):
    """`--storage 'sqlite:///PATH?timeout=30'` (SQLAlchemy's query: connection options) is the file PATH:
    `study list` and `study status` show what they show for `sqlite:///PATH`, and create no file."""
    _, db = _store(tmp_path)
    store = str(tmp_path / "store")
    before = sorted(p.name for p in db.parent.iterdir())
    for args in (("study", "list"), ("study", "status", "one-max")):
        plain = run_cli("--store", store, "--storage", f"sqlite:///{db}", *args).stdout
        queried = run_cli("--store", store, "--storage", f"sqlite:///{db}?timeout=30", *args).stdout
        assert "one-max" in plain and queried.replace("?timeout=30", "").split() == plain.split()  # (a centred title)
    assert sorted(p.name for p in db.parent.iterdir()) == before
