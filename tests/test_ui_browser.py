"""`hpolab ui` in a real browser: the real command serves MLflow's UI over a store with a finished
tiny study and its report; headless Chromium (Debian's /usr/bin/chromium, driven by Playwright)
opens the study's experiment, a trial run and the report artifact. Screenshots go to
test-output/ui/ under the repository root. Ctrl-C (SIGINT) then stops the UI cleanly.

Needs /usr/bin/chromium (`scripts/system-deps` installs it) and the `playwright` package; never
`playwright install` (it downloads a browser).
"""

from __future__ import annotations

import html
import importlib.util
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient

from conftest import ROOT, STUDY, copy_store, hpolab_env, mixed_study_template

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = ROOT / "test-output" / "ui"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
READY_TIMEOUT = 180  # seconds for `hpolab ui` to say the server answers (MLflow imports a lot)
UI_TIMEOUT_MS = 60_000  # the SPA's first load on a busy 2-core machine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (run scripts/system-deps as root)"),
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="needs the playwright package (pip install playwright; no `playwright install`)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ui_port() -> int:
    return _free_port()


@pytest.fixture(scope="module")
def study_store(tmp_path_factory, migrated_store, ui_port) -> Path:
    """The shared finished study (COMPLETE, PRUNED, FAIL), copied, with its report logged; the report
    links trials' runs and models to the UI that `ui_server` serves."""
    from hpolab.cli import main

    store = copy_store(mixed_study_template(tmp_path_factory, migrated_store), tmp_path_factory.mktemp("ui") / "store")
    assert main(["--store", str(store), "--storage", f"sqlite:///{store / 'optuna.db'}",
                 "--tracking-uri", f"sqlite:///{store / 'mlflow.db'}", "report", STUDY, "--ui-url", f"http://127.0.0.1:{ui_port}"]) == 0
    return store


@pytest.fixture
def ui_server(study_store, ui_port, tmp_path):
    """`hpolab --store DIR ui --port P` as a user runs it; yields (base URL, process, log path)."""
    port = ui_port
    log = tmp_path / "ui.log"
    exe = Path(sys.executable).with_name("hpolab")
    with log.open("w") as f:
        proc = subprocess.Popen([str(exe), "--store", str(study_store), "ui", "--port", str(port)], cwd=ROOT,
                                env=hpolab_env(), stdout=f, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while "MLflow UI ready" not in log.read_text():
            assert proc.poll() is None, f"hpolab ui exited {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"hpolab ui not ready after {READY_TIMEOUT}s:\n{log.read_text()}"
            time.sleep(0.5)
        assert f"open {url}" in log.read_text()
        yield url, proc, log
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _close_assistant(page) -> None:
    """MLflow 3.17 opens an assistant side panel; close it so the screenshots show the runs."""
    close = page.get_by_role("button", name="Close", exact=True)
    if close.count() == 1 and close.is_visible():
        close.click()


def _models_tab(page, url: str, exp_id: str, metric: str) -> dict[str, float]:
    """Open the experiment's Models tab ("Model training" view) and show `metric`'s column: the
    column selector hides the model attributes, the metrics without a dataset and the params, so
    the linked validation metrics are in view (the grid draws only the columns in view). Returns
    model name -> the metric as the table shows it."""
    from playwright.sync_api import expect

    page.goto(f"{url}/#/experiments/{exp_id}/models?workflowType=machine_learning")
    expect(page.get_by_role("link", name=f"{STUDY}-trial-0", exact=True).first).to_be_visible()
    _close_assistant(page)
    page.get_by_role("button", name="Columns", exact=True).click()
    for group in ("Model attributes", "No dataset", "Parameters"):
        page.locator(".du-bois-light-tree-treenode", has_text=group).first.locator(".du-bois-light-tree-checkbox").click()
    page.keyboard.press("Escape")
    expect(page.get_by_role("columnheader", name=metric, exact=True)).to_be_visible()
    # one grid row per model, split into a pinned part (the name) and a scrolled part (the metrics)
    cells = page.evaluate("""metric => [...document.querySelectorAll('[role=gridcell]')].map(c =>
        [c.closest('[role=row]').getAttribute('row-index'), c.getAttribute('col-id'), c.innerText])""", metric)
    names = {row: text.split("\n")[-1] for row, col, text in cells if col == "name"}
    values = {row: float(text) for row, col, text in cells  # (the grid writes its column ids HTML-escaped)
              if col.startswith("metrics.") and f'"metricKey":"{metric}"' in html.unescape(col)}
    assert set(names) == set(values), cells
    return {names[row]: values[row] for row in names}


def _check_search_logged_models(store: Path, exp_id: str, complete: dict[str, float]) -> None:
    """mlflow.search_logged_models, as a user calls it: ordered by val_acc, and filtered above the
    midpoint of the best two values (the models above it, from Optuna's values)."""
    import os

    import mlflow

    ranked = sorted(complete, key=lambda name: -complete[name])
    cut = (complete[ranked[0]] + complete[ranked[1]]) / 2
    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    try:
        ordered = mlflow.search_logged_models(experiment_ids=[exp_id], output_format="list",
                                              order_by=[{"field_name": "metrics.val_acc", "ascending": False}])
        above = mlflow.search_logged_models(experiment_ids=[exp_id], filter_string=f"metrics.val_acc > {cut!r}", output_format="list")
    finally:
        mlflow.set_tracking_uri(None)
        os.environ.pop("MLFLOW_TRACKING_URI", None)  # (set_tracking_uri exports it: later tests' commands would inherit it)
    assert [m.name for m in ordered] == ranked
    assert {m.name for m in above} == {name for name in complete if complete[name] > cut} != set()


def test_ui_shows_study_runs_metrics_and_report(study_store, ui_server, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    url, proc, log = ui_server
    client = MlflowClient(tracking_uri=f"sqlite:///{study_store / 'mlflow.db'}")
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{study_store / 'optuna.db'}")
    exp_id = client.get_experiment_by_name(STUDY).experiment_id
    parent_id = study.user_attrs["mlflow_parent_run_id"]
    trial_names = [f"trial-{t.number}" for t in study.trials]
    best = study.best_trial
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(UI_TIMEOUT_MS)
            expect.set_options(timeout=UI_TIMEOUT_MS)

            # 1. The study's experiment, runs view. MLflow 3 opens experiments in its GenAI view
            #    unless told otherwise; workflowType=machine_learning is its "Model training" toggle.
            page.goto(f"{url}/#/experiments/{exp_id}/runs?workflowType=machine_learning")
            parent_link = page.get_by_role("link", name=STUDY, exact=True).first
            expect(parent_link).to_be_visible()
            _close_assistant(page)
            # trial runs are nested under the parent run: expand it
            row = page.locator("[role=row]", has=parent_link).first
            row.locator('button[data-component-id*="runnamecellrenderer"]').click()
            for name in trial_names:
                expect(page.get_by_role("link", name=name, exact=True)).to_be_visible()
            expect(page.get_by_text(f"{len(trial_names) + 1} matching runs")).to_be_visible()
            page.screenshot(path=str(SHOTS / "1-experiment-runs.png"))

            # 2. One trial run: its page lists the per-epoch metrics with their last values.
            best_run = client.get_run(best.user_attrs["mlflow_run_id"])
            page.get_by_role("link", name=f"trial-{best.number}", exact=True).click()
            page.wait_for_url(re.compile(rf"#/experiments/{exp_id}/runs/{best_run.info.run_id}"))
            expect(page.get_by_role("heading", name=f"trial-{best.number}")).to_be_visible()
            metrics_heading = page.get_by_text(f"Metrics ({len(best_run.data.metrics)})", exact=True)
            expect(metrics_heading).to_be_visible()
            for metric in ("train_loss", "val_loss", "val_acc", "lr", "grad_norm", "epoch_seconds"):
                value = best_run.data.metrics[metric]
                text = repr(value) if value != int(value) else str(int(value))
                # (the last column names the logged model a metric is linked to)
                cells = re.compile(rf"^\s*{re.escape(metric)}\s*{re.escape(text)}\s*(?:{STUDY}-trial-{best.number})?\s*$")
                expect(page.get_by_role("row").filter(has_text=cells)).to_have_count(1)
            metrics_heading.scroll_into_view_if_needed()
            page.screenshot(path=str(SHOTS / "2-trial-run-metrics.png"))
            page.get_by_text("Model metrics", exact=True).first.click()
            for metric in ("val_acc", "val_loss", "train_loss"):
                expect(page.get_by_text(metric, exact=True).first).to_be_visible()
            page.wait_for_timeout(1500)  # let the charts finish drawing for the screenshot
            page.screenshot(path=str(SHOTS / "3-trial-run-charts.png"))
            # its System metrics tab: the trial's own processes, sampled under MLflow's system/ keys
            page.get_by_text("System metrics", exact=True).first.click()
            system = sorted(k for k in best_run.data.metrics if k.startswith("system/"))
            assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes", "system/thread_count"} <= set(system)
            for key in system:
                expect(page.get_by_text(key.removeprefix("system/"), exact=True).first).to_be_visible()
            page.wait_for_timeout(1500)
            page.screenshot(path=str(SHOTS / "3b-trial-run-system-metrics.png"))

            # 3. The report, an artifact of the parent run, shown by MLflow's artifact viewer.
            artifact = f"report/{STUDY}.html"
            page.goto(f"{url}/#/experiments/{exp_id}/runs/{parent_id}/artifacts/{artifact}")
            expect(page.get_by_text(artifact).first).to_be_visible()
            report = page.frame_locator("iframe").first
            expect(report.get_by_role("heading", name=f"Study {STUDY}")).to_be_visible()
            expect(report.locator(".js-plotly-plot")).to_have_count(6)  # every plot but the LR test's (none ran)
            report.locator("#learning-curves").scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            page.screenshot(path=str(SHOTS / "4-report-in-artifacts.png"))

            # 4. Downloaded from the server (what the viewer's download button fetches) and opened
            #    from disk with the network off: self-contained, every plot drawn.
            with page.expect_download() as dl:
                page.evaluate("url => { const a = document.createElement('a'); a.href = url; document.body.appendChild(a); a.click(); }",
                              f"{url}/get-artifact?path={artifact}&run_uuid={parent_id}")
            saved = tmp_path / f"{STUDY}.html"
            dl.value.save_as(saved)
            offline = browser.new_context(offline=True, viewport={"width": 1300, "height": 900})
            local = offline.new_page()
            local.goto(saved.as_uri())
            expect(local.get_by_role("heading", name=f"Study {STUDY}")).to_be_visible()
            expect(local.locator(".js-plotly-plot")).to_have_count(6)
            expect(local.locator("#promotion")).to_contain_text("Not promoted yet")
            # the best trial's logged model, linked by name to its page in this UI (step 6 opens it)
            best_model = client.get_logged_model(best_run.data.tags["hpolab.model_id"])
            model_page = f"{url}/#/experiments/{exp_id}/models/{best_model.model_id}"
            expect(local.get_by_role("link", name=best_model.name, exact=True).first).to_have_attribute("href", model_page)
            local.screenshot(path=str(SHOTS / "5-report-offline.png"), full_page=True)
            offline.close()

            # 5. The experiment's Models tab: each COMPLETE trial's model, named <study>-trial-<n>, and
            #    the val_acc linked to it as a column, equal to the trial's value in Optuna.
            complete = {f"{STUDY}-trial-{t.number}": t.value for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
            logged = client.search_logged_models(experiment_ids=[exp_id])
            assert {m.name for m in logged} == set(complete)
            assert all(client.get_run(m.source_run_id).info.run_name == m.name.removeprefix(f"{STUDY}-") for m in logged)
            shown = _models_tab(page, url, exp_id, "val_acc")
            assert shown == {name: pytest.approx(value, rel=1e-12) for name, value in complete.items()}
            page.screenshot(path=str(SHOTS / "6-experiment-models.png"))

            # 6. The report's link: the logged model's page, with its name and linked metrics.
            page.goto(model_page)
            expect(page.get_by_role("heading", name=best_model.name).first).to_be_visible()
            expect(page.get_by_role("row").filter(has_text=re.compile(r"^\s*val_acc\s*val \(#"))).to_have_count(1)  # on the val split
            page.screenshot(path=str(SHOTS / "7-logged-model.png"))
        finally:
            browser.close()

    # The models by a metric, as the Models tab would sort and filter them (its sort and search controls
    # are off in MLflow 3.17's open-source UI): the order and the filter match the Optuna study's values.
    _check_search_logged_models(study_store, exp_id, complete)

    for name in ("1-experiment-runs", "2-trial-run-metrics", "3-trial-run-charts", "3b-trial-run-system-metrics", "4-report-in-artifacts",
                 "5-report-offline",
                 "6-experiment-models", "7-logged-model"):
        assert (SHOTS / f"{name}.png").stat().st_size > 10_000, name

    # Ctrl-C: the UI stops its server and exits 0
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0, log.read_text()
    assert "MLflow UI stopped" in log.read_text()
    with socket.socket() as s:  # the port is free again: no server left listening
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))
