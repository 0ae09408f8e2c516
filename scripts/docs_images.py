"""Make the docs' screenshots from the demo study, as a newcomer sees it after `scripts/demo`.

    .venv/bin/python scripts/docs_images.py [--store DIR] [--out DIR] [--quick]     (scripts/docs images)

1. The demo study: `hpolab study run studies/digits_cnn.yaml` on the store, as scripts/demo runs it
   (skipped when the store already holds a finished `digits-cnn`), then `hpolab report digits-cnn`
   and `hpolab promote digits-cnn`, as the five-minute tour does.
2. `hpolab ui` on a free loopback port, and Debian's Chromium (/usr/bin/chromium, headless, driven by
   Playwright: never a downloaded browser) on its pages; the report opened from disk with the network off.
3. One PNG per entry of IMAGES into docs/img/ (or --out), each taken only once the page shows what the
   caption in the docs says (the study's runs, its kept models with their val_acc, the report's heading
   and plots): the script fails otherwise.

--store: default a new temporary store (the study runs from scratch: about a minute on 2 cores).
--quick: a smaller study (4 trials of 2 epochs) for the test suite (tests/test_docs_images.py); the
docs' own images come from the full demo study.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDY = "digits-cnn"
SPEC = "studies/digits_cnn.yaml"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
TIMEOUT_MS = 60_000  # a page's first load on a busy 2-core machine

# file -> what it shows (the docs' captions say the same)
IMAGES = {
    "experiment-runs.png": "the study's trial runs in the MLflow UI (Model training view), sorted by the val_acc of "
                           "their last epoch, with the sampled parameters",
    "experiment-models.png": "the study's models in the MLflow UI's Models tab: the kept trial models with the val_loss "
                             "and val_acc of the epoch their weights come from, and the promoted model (test metrics hidden)",
    "report-offline.png": "the top of the study's offline HTML report, opened from disk",
    "trial-system-metrics.png": "the System metrics tab of the best trial's run in the MLflow UI: the trial's own "
                                "processes sampled under MLflow's system/ keys",
}


def _hpolab(*args: str, store: Path, check: bool = True) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("hpolab")
    env = {k: v for k, v in os.environ.items() if k not in ("OPTUNA_STORAGE", "MLFLOW_TRACKING_URI", "HPOLAB_STORE")}
    proc = subprocess.run([str(exe), "--store", str(store), *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"hpolab {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc


def _finished(store: Path) -> bool:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not (store / "optuna.db").exists():
        return False
    try:
        study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{store / 'optuna.db'}")
    except KeyError:
        return False
    return sum(t.state.is_finished() for t in study.trials) >= 1


def demo_study(store: Path, quick: bool, port: int) -> None:
    if not _finished(store):
        extra = ["n_trials=4", "trainer.max_epochs=2"] if quick else []
        print(f"running the demo study into {store} ...", flush=True)
        _hpolab("study", "run", SPEC, *extra, store=store)
    _hpolab("report", STUDY, "--ui-url", f"http://127.0.0.1:{port}", store=store)
    promoted = _hpolab("promote", STUDY, store=store, check=False)
    if promoted.returncode not in (0, 3):  # 3: the champion is already at least as good (a re-run)
        raise SystemExit(f"hpolab promote exited {promoted.returncode}:\n{promoted.stdout[-2000:]}\n{promoted.stderr[-2000:]}")


# the study's own trial runs: a promotion race's seed runs are trials too, of its own study (`<study>.race-<key>`)
TRIAL_RUNS = f"tags.hpolab.role = 'trial' and tags.`optuna.study` = '{STUDY}'"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ui:
    """`hpolab ui` on the store until the block ends; Ctrl-C then stops it as a user would."""

    def __init__(self, store: Path, port: int):
        self.store, self.port, self.url = store, port, f"http://127.0.0.1:{port}"

    def __enter__(self) -> "Ui":
        exe = Path(sys.executable).with_name("hpolab")
        self.log = Path(tempfile.mkstemp(prefix="hpolab-ui-", suffix=".log")[1])
        with self.log.open("w") as f:
            self.proc = subprocess.Popen([str(exe), "--store", str(self.store), "ui", "--port", str(self.port)], cwd=ROOT,
                                         stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while "MLflow UI ready" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise SystemExit(f"hpolab ui did not come up:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.unlink(missing_ok=True)


def _close_assistant(page) -> None:
    """MLflow 3.17 opens an assistant side panel; close it so the picture shows the runs."""
    close = page.get_by_role("button", name="Close", exact=True)
    if close.count() == 1 and close.is_visible():
        close.click()


def _toggle_columns(page, names: list[str]) -> None:
    """Tick (or untick) these entries of the runs table's column chooser, each matched whole."""
    page.get_by_role("button", name="Columns", exact=True).click()
    for name in names:
        node = page.locator(".du-bois-light-tree-treenode").filter(has_text=re.compile(f"^{re.escape(name)}$")).first
        node.locator(".du-bois-light-tree-checkbox").click()
    page.keyboard.press("Escape")


def shoot_runs(page, url: str, exp_id: str, trials: list[str], params: list[str], path: Path) -> None:
    """The study's trial runs (searched by their `hpolab.role` and `optuna.study` tags), best val_acc first, with the sampled params."""
    from urllib.parse import quote

    from playwright.sync_api import expect

    # workflowType=machine_learning: MLflow 3's "Model training" view (it opens experiments in its GenAI view)
    search = quote(TRIAL_RUNS)
    page.goto(f"{url}/#/experiments/{exp_id}/runs?workflowType=machine_learning"
              f"&orderByKey={quote('metrics.`val_acc`')}&orderByAsc=false&searchFilter={search}")
    expect(page.get_by_role("link", name=trials[0], exact=True)).to_be_visible()
    _toggle_columns(page, ["Dataset", "Source", "val_acc", *params])
    _close_assistant(page)
    rows = page.get_by_role("link", name=re.compile(r"^trial-\d+$"))
    expect(rows.first).to_be_visible()
    if rows.first.inner_text() not in trials:
        raise SystemExit(f"the runs table's first run is {rows.first.inner_text()}; the best by val_acc: {trials}")
    expect(page.get_by_role("columnheader", name=re.compile("val_acc")).first).to_be_visible()
    page.wait_for_timeout(1000)
    page.screenshot(path=str(path))


def shoot_models(page, url: str, exp_id: str, models: dict[str, float], path: Path) -> None:
    """The Models tab with the val_acc column in view (the column chooser hides the model attributes, the
    test metrics, the metrics without a dataset and the params); checks the table shows each kept model's
    val_acc. (Its sort control only orders by creation time in MLflow 3.17.)"""
    import html

    from playwright.sync_api import expect

    page.goto(f"{url}/#/experiments/{exp_id}/models?workflowType=machine_learning")
    expect(page.get_by_role("link", name=sorted(models)[0], exact=True).first).to_be_visible()
    _close_assistant(page)
    page.get_by_role("button", name="Columns", exact=True).click()
    for group in ("Model attributes", "Dataset: test", "No dataset", "Parameters"):
        page.locator(".du-bois-light-tree-treenode", has_text=group).first.locator(".du-bois-light-tree-checkbox").click()
    page.keyboard.press("Escape")
    _close_assistant(page)
    expect(page.get_by_role("columnheader", name="val_acc", exact=True)).to_be_visible()
    cells = page.evaluate("""() => [...document.querySelectorAll('[role=gridcell]')].map(c =>
        [c.closest('[role=row]').getAttribute('row-index'), c.getAttribute('col-id'), c.innerText])""")
    names = {row: text.split("\n")[-1] for row, col, text in cells if col == "name"}
    values = {row: float(text) for row, col, text in cells
              if col.startswith("metrics.") and '"metricKey":"val_acc"' in html.unescape(col) and text.strip()}
    shown = {names[r]: values.get(r) for r in names}
    if set(shown) != set(models) or any(v is not None and abs((shown[m] or -1) - v) > 1e-9 for m, v in models.items()):
        raise SystemExit(f"the Models tab shows {shown}, the study's kept models are {models}")
    page.wait_for_timeout(500)
    page.screenshot(path=str(path))


def shoot_system_metrics(page, url: str, exp_id: str, run, path: Path) -> None:
    """The best trial run's System metrics tab; checks a chart of each of its system/ metrics is there."""
    from playwright.sync_api import expect

    page.goto(f"{url}/#/experiments/{exp_id}/runs/{run.info.run_id}?workflowType=machine_learning")
    expect(page.get_by_role("heading", name=run.info.run_name)).to_be_visible()
    _close_assistant(page)
    page.get_by_text("System metrics", exact=True).first.click()
    keys = sorted(k.removeprefix("system/") for k in run.data.metrics if k.startswith("system/"))
    if not keys:
        raise SystemExit(f"run {run.info.run_name} has no system/ metrics (system_metrics: false in the spec?)")
    # The tab draws only the charts in view: find each one through its search box, then show them all.
    search = page.get_by_role("searchbox", name="Search metric charts")
    for key in keys:
        search.fill(key)
        expect(page.get_by_role("heading", name=key, exact=True)).to_be_visible()
    search.fill("")
    page.wait_for_timeout(1500)  # let the charts finish drawing
    page.screenshot(path=str(path))


def shoot_report(browser, report: Path, path: Path) -> None:
    from playwright.sync_api import expect

    offline = browser.new_context(offline=True, viewport={"width": 1300, "height": 900})
    try:
        page = offline.new_page()
        page.goto(report.as_uri())
        expect(page.get_by_role("heading", name=f"Study {STUDY}")).to_be_visible(timeout=TIMEOUT_MS)
        expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=TIMEOUT_MS)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(path))
    finally:
        offline.close()


def screenshots(store: Path, out: Path, port: int) -> list[Path]:
    import optuna
    from mlflow import MlflowClient
    from playwright.sync_api import expect, sync_playwright

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name(STUDY).experiment_id
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{store / 'optuna.db'}")
    # the table sorts the trial runs by their latest val_acc (the last epoch's): the runs that share the top value
    runs = client.search_runs([exp_id], TRIAL_RUNS, max_results=1000)
    top = max(r.data.metrics.get("val_acc", float("-inf")) for r in runs)
    ranked = [r.info.run_name for r in runs if r.data.metrics.get("val_acc") == top]
    params = [f"{p}" for p in study.best_trial.params]
    # the kept trial models (their val_acc) and the promoted model (digits-cnn-v1: test metrics only)
    kept = {m.name: {x.key: x.value for x in m.metrics} for m in client.search_logged_models(experiment_ids=[exp_id])}
    models = {name: metrics.get("val_acc") for name, metrics in kept.items()}
    best_run = client.get_run(study.best_trial.user_attrs["mlflow_run_id"])
    out.mkdir(parents=True, exist_ok=True)
    with Ui(store, port) as ui, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 800})
            page.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)
            try:
                shoot_runs(page, ui.url, exp_id, ranked, params, out / "experiment-runs.png")
                shoot_models(page, ui.url, exp_id, models, out / "experiment-models.png")
                shoot_report(browser, store / "reports" / f"{STUDY}.html", out / "report-offline.png")
                shoot_system_metrics(page, ui.url, exp_id, best_run, out / "trial-system-metrics.png")
            except Exception:
                page.screenshot(path=str(out / "failed.png"))  # what the page showed instead
                print(f"the page when it failed: {out / 'failed.png'}", file=sys.stderr)
                raise
        finally:
            browser.close()
    return [out / name for name in IMAGES]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, help="the store to use (default: a new temporary one)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the PNGs go (default docs/img)")
    ap.add_argument("--quick", action="store_true", help="a 4-trial, 2-epoch study instead of the demo's (for tests)")
    args = ap.parse_args(argv)
    if not CHROMIUM.exists():
        raise SystemExit(f"needs Debian's chromium at {CHROMIUM} (scripts/system-deps installs it)")
    store = (args.store or Path(tempfile.mkdtemp(prefix="hpolab-docs-images-")) / "store").resolve()
    port = _free_port()
    demo_study(store, args.quick, port)
    for path in screenshots(store, args.out.resolve(), port):
        print(f"wrote {path}: {IMAGES[path.name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
