"""`hpolab compare`: the table of a real tiny study (COMPLETE, PRUNED and FAIL trials) checked
against both stores, its formats, and runs side by side.

The study is built once per test run by the real CLI (conftest.mixed_study_template) and shared
read-only with test_report.py and test_ui_browser.py; tests that write get a copy.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import optuna
import pandas as pd
import pytest
from mlflow import MlflowClient

from conftest import STUDY, copy_store, hpolab_env, run_cli

# Tests that read the study the real CLI builds (about a minute, once) are slow; errors on an empty store are not.

def _stores(store: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{store / 'optuna.db'}")
    return client, study


def _main(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI in-process (seconds cheaper than a subprocess): exit code, stdout, stderr."""
    from hpolab.cli import main

    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_template_has_all_three_states(template):
    _, study = _stores(template)
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE", "COMPLETE", "FAIL", "PRUNED"]


@pytest.mark.slow
def test_compare_json_matches_the_stores(template, capsys):
    code, out, _ = _main(capsys, "--store", str(template), "compare", STUDY, "--format", "json")
    assert code == 0
    rows = json.loads(out)
    client, study = _stores(template)
    trials = study.get_trials()
    assert sorted(r["trial"] for r in rows) == [0, 1, 2, 3]
    # best first: the complete trials by val_acc (maximize), then the pruned one, the failed one last
    complete = sorted((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: -t.value)
    assert [r["trial"] for r in rows] == [complete[0].number, complete[1].number, 3, 2]
    for r in rows:
        t = trials[r["trial"]]
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert r["state"] == t.state.name == run.data.tags["hpolab.state"]
        assert r["run_id"] == run.info.run_id
        for name, value in t.params.items():
            assert r[f"params.{name}"] == value  # full precision, not a display rounding
        assert set(k for k in r if k.startswith("params.")) == {f"params.{p}" for p in t.params}
        assert r["epochs"] == len(t.intermediate_values)
        assert r["duration_s"] == pytest.approx((t.datetime_complete - t.datetime_start).total_seconds())
        if t.intermediate_values:
            last = t.intermediate_values[max(t.intermediate_values)]
            assert r["final_val_acc"] == last == run.data.metrics["val_acc"]
            assert r["best_val_acc"] == max(t.intermediate_values.values())
            assert r["metrics.val_loss"] == run.data.metrics["val_loss"]
        if t.state.name == "COMPLETE":
            assert r["best_val_acc"] == t.value == float(run.data.tags["hpolab.best_val_acc"])
            assert r["fail_reason"] is None and r["pruned_at_epoch"] is None
        elif t.state.name == "PRUNED":
            assert r["pruned_at_epoch"] == int(run.data.tags["hpolab.pruned_at_epoch"]) == 1
        else:
            assert r["fail_reason"] == run.data.tags["hpolab.fail_reason"]
            assert "nan" in r["fail_reason"].lower()
            assert r["best_val_acc"] is None and r["final_val_acc"] is None


@pytest.mark.slow
def test_compare_state_top_sort_and_formats(template, capsys):
    store = str(template)
    _, study = _stores(template)
    best = study.best_trial.number

    code, out, _ = _main(capsys, "--store", store, "compare", STUDY, "--format", "json", "--state", "pruned")
    assert code == 0 and [r["state"] for r in json.loads(out)] == ["PRUNED"]
    code, out, _ = _main(capsys, "--store", store, "compare", STUDY, "--format", "json", "--state", "fail")
    assert [r["trial"] for r in json.loads(out)] == [2]
    code, out, _ = _main(capsys, "--store", store, "compare", STUDY, "--format", "json", "--top", "1")
    assert [r["trial"] for r in json.loads(out)] == [best]
    # --top K reads only the K shown trials' runs: the row still carries its run's metrics
    top = json.loads(out)[0]
    assert top["run_id"] == study.best_trial.user_attrs["mlflow_run_id"] and top["metrics.val_loss"] is not None
    # --sort takes a column, a param's short path or an MLflow metric; losses sort ascending
    code, out, _ = _main(capsys, "--store", store, "compare", STUDY, "--format", "json", "--sort", "val_loss", "--state", "complete")
    losses = [r["metrics.val_loss"] for r in json.loads(out)]
    assert losses == sorted(losses)
    code, out, _ = _main(capsys, "--store", store, "compare", STUDY, "--format", "json", "--sort", "trainer.lr:desc")
    lrs = [r["params.trainer.lr"] for r in json.loads(out)]
    assert lrs == sorted(lrs, reverse=True)

    # csv: the same records as json, every column, full precision
    _, js, _ = _main(capsys, "--store", store, "compare", STUDY, "--format", "json")
    code, csv, _ = _main(capsys, "--store", store, "compare", STUDY, "--format", "csv")
    assert code == 0
    df = pd.read_csv(io.StringIO(csv))
    records = json.loads(js)
    assert list(df.columns) == list(records[0].keys())
    assert list(df["trial"]) == [r["trial"] for r in records]
    assert list(df["params.trainer.lr"]) == [r["params.trainer.lr"] for r in records]
    assert list(df["run_id"]) == [r["run_id"] for r in records]

    # markdown: a header, a separator and one row per trial, the same number of cells each
    code, md, _ = _main(capsys, "--store", store, "compare", STUDY, "--format", "markdown")
    lines = md.strip().splitlines()
    assert len(lines) == 2 + 4
    assert lines[0].startswith("| trial | state |") and "best val_acc" in lines[0]
    assert set(lines[1].replace("|", "").replace("-", "").replace(":", "")) == set()
    cells = {line.replace("\\|", "").count("|") for line in lines}
    assert len(cells) == 1
    assert all(r["run_id"] in md for r in records)


@pytest.mark.slow
def test_compare_table_fits_the_terminal(template):
    """The real console script, as a user runs it, in a 100-column terminal."""
    env = hpolab_env()
    env["COLUMNS"] = "100"
    narrow = run_cli("--store", str(template), "compare", STUDY, env=env).stdout
    lines = narrow.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 100
    for state in ("COMPLETE", "PRUNED", "FAIL"):
        assert state in narrow
    assert "lr" in narrow and "dropout" in narrow  # short param names
    _, study = _stores(template)
    for t in study.get_trials():
        assert t.user_attrs["mlflow_run_id"][:8] in narrow
    assert "…" not in "".join(line for line in lines if "COMPLETE" in line)  # no value is cut


@pytest.mark.slow
def test_compare_table_uses_a_wide_terminal(template, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "230")
    _, study = _stores(template)
    code, wide, _ = _main(capsys, "--store", str(template), "compare", STUDY)
    assert code == 0
    assert max(len(line.rstrip()) for line in wide.splitlines()) <= 230
    for t in study.get_trials():
        assert t.user_attrs["mlflow_run_id"] in wide  # full ids when they fit
    assert "training loss is nan" in wide


@pytest.mark.slow
def test_compare_runs_side_by_side_across_studies(template, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    store = copy_store(template, tmp_path / "store")
    client, study = _stores(store)
    a = study.trials[0].user_attrs["mlflow_run_id"]
    b = study.trials[3].user_attrs["mlflow_run_id"]
    # a run of another study (experiment), logged by hand
    other_exp = client.create_experiment("other-study")
    other = client.create_run(other_exp, run_name="trial-0").info.run_id
    client.log_param(other, "trainer.lr", "0.5")
    client.log_param(other, "model.depth", "2")
    client.log_metric(other, "val_acc", 0.5, step=1)
    client.set_terminated(other)

    code, out, _ = _main(capsys, "--store", str(store), "compare", a, b, other, "--format", "json")
    assert code == 0
    rows = {(r["section"], r["key"]): r for r in json.loads(out)}
    labels = [f"{STUDY}/trial-0", f"{STUDY}/trial-3", "other-study/trial-0"]
    assert list(json.loads(out)[0].keys()) == ["section", "key", *labels, "differs"]
    lr = rows[("param", "trainer.lr")]
    assert [lr[lab] for lab in labels] == [client.get_run(a).data.params["trainer.lr"], client.get_run(b).data.params["trainer.lr"], "0.5"]
    assert lr["differs"] is True
    assert rows[("param", "model.depth")]["differs"] is False  # "2" everywhere
    assert rows[("param", "trainer.optimizer")][labels[2]] is None  # the other run never logged it
    assert rows[("metric", "val_acc")][labels[0]] == client.get_run(a).data.metrics["val_acc"]
    assert rows[("run", "study")][labels[2]] == "other-study"
    assert rows[("run", "state")][labels[1]] == "PRUNED"

    code, table, _ = _main(capsys, "--store", str(store), "compare", a, b, other)
    assert code == 0
    assert "≠" in table and "trainer.lr" in table and "other-study/trial-0" in table
    diff_lines = [line for line in table.splitlines() if "≠" in line]
    assert any("trainer.lr" in line for line in diff_lines)
    assert not any("model.depth" in line for line in diff_lines)
    code, md, _ = _main(capsys, "--store", str(store), "compare", a, b, "--format", "markdown")
    assert "**≠** param `trainer.lr`" in md


@pytest.mark.parametrize(
    "args, message",
    [
        (["no-such-study"], "no study named 'no-such-study'"),
        (["0" * 32], "looks like a run id"),
        (["0" * 32, STUDY], "not MLflow run ids"),
        (["0" * 32, "1" * 32], "no MLflow run 00000000000000000000000000000000"),
        ([STUDY, "--sort", "bogus"], "--sort bogus: no such column"),
        ([STUDY, "--top", "0"], "--top must be >= 1"),
    ],
)
@pytest.mark.slow
def test_compare_user_errors(template, capsys, args, message):
    code, out, err = _main(capsys, "--store", str(template), "compare", *args)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["no-such-study"], "no study named 'no-such-study'"),
    (["0" * 32, "1" * 32], "no MLflow run 00000000000000000000000000000000"),
])
def test_compare_user_errors_on_an_empty_store(store, capsys, args, message):
    code, out, err = _main(capsys, "--store", str(store), "compare", *args)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
