"""`hpolab report`: a finished real study (with a champion and an LR range test added), an empty
study, and a still-running study with one finished trial. The HTML must parse, be self-contained
and hold each plot (or a sentence saying why a plot cannot be drawn yet)."""

from __future__ import annotations

import math
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pandas as pd
import pytest
from mlflow import MlflowClient

from conftest import STUDY, copy_store, run_cli

PLOTS = ["optimization-history", "learning-curves", "param-importances", "parallel-coordinates", "slice", "timeline", "lr-range-test"]
SECTIONS = PLOTS + ["top-trials", "race", "promotion"]


class Page(HTMLParser):
    """Collects what the tests look at: section ids, plot divs, scripts, visible text."""

    def __init__(self, text: str):
        super().__init__()
        self.sections: list[str] = []
        self.plots: dict[str, int] = {}  # data-plot key -> plotly divs inside it
        self.script_srcs: list[str] = []
        self.inline_scripts = 0
        self.stack: list[str] = []
        self.text: list[str] = []
        self._plot: str | None = None
        self._in_script = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.sections.append(a.get("id"))
        if tag == "div" and "data-plot" in a:
            self._plot = a["data-plot"]
            self.plots[self._plot] = 0
        if tag == "div" and "plotly-graph-div" in (a.get("class") or "") and self._plot:
            self.plots[self._plot] += 1
        if tag == "script":
            self._in_script = True
            if a.get("src"):
                self.script_srcs.append(a["src"])
            else:
                self.inline_scripts += 1
        if tag in ("link", "img", "iframe") and (a.get("href") or a.get("src") or "").startswith(("http:", "https:", "//")):
            self.script_srcs.append(a.get("href") or a.get("src"))

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if not self._in_script:
            self.text.append(data)

    @property
    def visible(self) -> str:
        return " ".join("".join(self.text).split())


def check_self_contained(html: str) -> Page:
    page = Page(html)
    assert html.lstrip().startswith("<!DOCTYPE html>")
    assert page.script_srcs == []  # no CDN, nothing fetched: it opens offline
    # the plotly.js bundle is inlined exactly once, however many figures there are
    assert html.count("* plotly.js v") == 1
    assert html.count("Plotly.newPlot(") == sum(page.plots.values())
    assert page.sections == SECTIONS
    return page


def _add_champion(client: MlflowClient, study: optuna.Study) -> str:
    """What `hpolab promote` leaves behind: a registered model named like the study, alias champion."""
    best = study.best_trial
    run = client.get_run(best.user_attrs["mlflow_run_id"])
    client.create_registered_model(STUDY)
    model = client.get_logged_model(run.data.tags["hpolab.model_id"])
    # source = the logged model's location (a models:/ source makes MLflow use the global client)
    tags = {"hpolab.study": STUDY, "hpolab.trial_number": str(best.number), "hpolab.trial_run_id": run.info.run_id,
            "hpolab.test_acc": "0.8125", "hpolab.test_loss": "0.61", "hpolab.gate_metric": "test_acc"}
    mv = client.create_model_version(STUDY, model.artifact_location, run_id=run.info.run_id, model_id=model.model_id, tags=tags)
    client.set_registered_model_alias(STUDY, "champion", mv.version)
    return mv.version


def _add_lr_range_test(client: MlflowClient, study: optuna.Study) -> str:
    """What the study's LR range test leaves behind: its run (metric series) and the study user attr."""
    exp = client.get_experiment_by_name(STUDY)
    run_id = client.create_run(exp.experiment_id, run_name="lr-range-test",
                               tags={"mlflow.parentRunId": study.user_attrs["mlflow_parent_run_id"]}).info.run_id
    for step in range(40):
        lr = 1e-6 * 10 ** (step / 6)
        loss = 2.3 - 1.5 * math.exp(-((math.log10(lr) + 2.5) ** 2)) + (0.0 if lr < 0.1 else 5 * lr)
        client.log_metric(run_id, "lr_test_lr", lr, step=step)
        client.log_metric(run_id, "lr_test_loss", loss + 0.02 * ((-1) ** step), step=step)
        client.log_metric(run_id, "lr_test_smoothed_loss", loss, step=step)
    client.set_terminated(run_id)
    study.set_user_attr("lr_range_test", {"low": 1e-4, "high": 1e-2, "suggestion": 3e-3, "rule": "valley",
                                          "diverged_at_lr": 0.3, "mlflow_run_id": run_id})
    return run_id


def assert_same_data(sql, through_clients):
    """The report's data read with plain SQL (report_sql.py) equals what MlflowClient gives."""
    a, b = sql, through_clients
    assert (a.metric, a.direction, a.counts, a.experiment_id, a.problems) == (b.metric, b.direction, b.counts, b.experiment_id, b.problems)
    assert (a.parent_run.info.run_id, a.parent_run.data.tags, a.parent_run.data.params) == \
        (b.parent_run.info.run_id, b.parent_run.data.tags, b.parent_run.data.params)
    pd.testing.assert_frame_equal(a.table.frame.drop(columns=["duration_s"]), b.table.frame.drop(columns=["duration_s"]))
    assert a.lr_test == b.lr_test
    pa, pb = a.promotion, b.promotion
    assert {k: v for k, v in pa.items() if k not in ("versions", "champion")} == {k: v for k, v in pb.items() if k not in ("versions", "champion")}

    def version(v):
        return None if v is None else (int(v.version), v.run_id, v.description, v.creation_timestamp, dict(v.tags))
    assert [version(v) for v in pa.get("versions", [])] == [version(v) for v in pb.get("versions", [])]
    assert version(pa.get("champion")) == version(pb.get("champion"))


@pytest.mark.slow
def test_report_on_a_finished_study(template, tmp_path):
    from hpolab.analysis.report.command import _read_only
    from hpolab.analysis.report.data import gather
    from hpolab.analysis.report.sql import gather_sql
    from hpolab.stores.paths import resolve_stores

    store = copy_store(template, tmp_path / "store")
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{store / 'optuna.db'}")
    stores = resolve_stores(str(store))
    assert gather_sql(_read_only(study, stores), stores).promotion == {"state": "none"}
    version = _add_champion(client, study)
    _add_lr_range_test(client, study)
    assert_same_data(gather_sql(_read_only(study, stores), stores), gather(_read_only(study, stores), stores))

    proc = run_cli("--store", str(store), "report", STUDY)
    out = store / "reports" / f"{STUDY}.html"
    assert f"report: {out}" in proc.stdout and "logged to MLflow" in proc.stdout
    html = out.read_text()
    page = check_self_contained(html)
    assert all(page.plots.get(k) == 1 for k in PLOTS), page.plots
    text = page.visible
    # summary: direction, counts, best trial and its params
    best = study.best_trial
    assert f"Best trial: {best.number}" in text and "maximize" in text
    assert "2 / 1 / 1" in text  # complete / pruned / failed
    for name in best.params:
        assert name in text
    # the top trials table lists every complete trial's run; the failure says why
    for t in study.get_trials():
        if t.state.name in ("COMPLETE", "FAIL"):
            assert t.user_attrs["mlflow_run_id"] in text
    assert "training loss is nan" in text
    # pruned trials are marked on the learning curves
    assert "pruned here" in html
    # promotion state: the champion version and its test metric
    assert f"Champion: {STUDY} version {version}, from trial {best.number} — test_acc = 0.8125" in text
    assert "LR search range" in html

    # logged on the parent run, so it opens from the MLflow UI; identical to the local file
    parent = study.user_attrs["mlflow_parent_run_id"]
    assert [a.path for a in client.list_artifacts(parent, "report")] == [f"report/{STUDY}.html"]
    local = client.download_artifacts(parent, f"report/{STUDY}.html", str(tmp_path))
    assert Path(local).read_text() == html
    assert str(template) not in str(client.get_run(parent).info.artifact_uri)


def test_report_on_an_empty_study(tmp_path, store, capsys):
    """A study whose driver created it (and its parent run) but finished no trial yet."""
    from hpolab.cli import main
    from hpolab.stores.paths import resolve_stores
    from hpolab.stores import mlflow_runs as tr

    stores = resolve_stores(str(store))
    study = optuna.create_study(study_name="empty", storage=stores.optuna_url, direction="minimize")
    client = tr.client_for(stores)
    exp = tr.get_or_create_experiment(client, "empty", stores)
    parent = client.create_run(exp, run_name="empty").info.run_id
    client.log_param(parent, "metric", "val_loss")
    study.set_user_attr("mlflow_parent_run_id", parent)

    out = tmp_path / "empty.html"
    assert main(["--store", str(store), "report", "empty", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "0 finished trials" in printed and "logged to MLflow" in printed
    page = check_self_contained(out.read_text())
    assert page.plots == {}
    text = page.visible
    assert "No finished trials yet" in text
    assert "No complete trial yet" in text and "No trial has started yet" in text
    assert "Not promoted yet" in text and "ran no LR range test" in text
    assert "val_loss" in text and "minimize" in text
    assert [a.path for a in client.list_artifacts(parent, "report")] == ["report/empty.html"]


def test_report_on_a_running_study_with_one_finished_trial(store, capsys):
    """Optuna only (no MLflow side at all): one COMPLETE trial, one still RUNNING."""
    from hpolab.cli import main

    study = optuna.create_study(study_name="half", storage=f"sqlite:///{store / 'optuna.db'}", direction="maximize")
    dists = {"trainer.lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)}
    t0 = study.ask(dists)
    for epoch, v in enumerate([0.3, 0.6, 0.7], start=1):
        t0.report(v, epoch)
    study.tell(t0, 0.7)
    t1 = study.ask(dists)
    t1.report(0.2, 1)  # still running: never told

    assert main(["--store", str(store), "report", "half"]) == 0
    printed = capsys.readouterr().out
    assert "1 finished trial;" in printed and "not logged to MLflow" in printed
    page = check_self_contained((store / "reports" / "half.html").read_text())
    text = page.visible
    assert "Only one finished trial" in text and "still running" in text
    for drawn in ("optimization-history", "learning-curves", "slice", "timeline"):
        assert page.plots.get(drawn) == 1, drawn
    assert "need at least 2 complete trials; this study has 1" in text
    assert "param-importances" not in page.plots and "parallel-coordinates" not in page.plots
    assert "value" in text  # no MLflow: the metric's name is unknown, Optuna's "value" is used
