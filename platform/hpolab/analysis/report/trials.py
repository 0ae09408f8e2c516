"""The report's trial tables (the top trials, the failed ones) and how they point into MLflow.

Each trial names its run and its logged model (compare's model_id / model_name columns). Where the
report knows the MLflow UI's address (`hpolab report --ui-url URL`, else the tracking server's own when
the tracking URI is http(s)) they are links to the UI's pages: `#/experiments/<id>/runs/<run id>` and
MLflow 3's logged-model page `#/experiments/<id>/models/<model id>`; otherwise the run id and the model's
`models:/<model id>` URI are shown as text (an embedded store has no UI until `hpolab ui` serves one).
A trial whose model retention deleted has no model column value: nothing links to a deleted model.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from hpolab.analysis.report import html as H
from hpolab.analysis.report.data import TOP_ROWS, ReportData

UI_URL_EXAMPLE = "http://127.0.0.1:5000"  # what `hpolab ui` serves by default


def check_ui_url(url: str) -> str:
    """`--ui-url`: an http(s) address with a host; without a trailing slash. UserError otherwise."""
    from hpolab.errors import UserError

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"--ui-url {url}: give the MLflow UI's web address, e.g. {UI_URL_EXAMPLE} (what `hpolab ui` prints)")
    return url.rstrip("/")


def ui_url_of(tracking_uri: str, given: str | None) -> str | None:
    """The MLflow UI's address: `given` (--ui-url), else the tracking server's when the tracking URI is
    one, without its login (user:password in a URI must never reach a page); None when unknown."""
    from hpolab.stores.paths import server_ui_url

    return check_ui_url(given) if given else server_ui_url(tracking_uri)


def _link(href: str, text: str, title: str | None = None) -> str:
    extra = f" title=\"{H.esc(title)}\"" if title else ""
    return f"<a href=\"{H.esc(href)}\" target=\"_blank\" rel=\"noopener\"{extra}>{H.esc(text)}</a>"


def run_cell(data: ReportData, run_id: str | None) -> str:
    """A trial's run: its page in the MLflow UI, or its id."""
    if not run_id:
        return "–"
    if data.ui_url and data.experiment_id is not None:
        return f"<span class=mono>{_link(f'{data.ui_url}/#/experiments/{data.experiment_id}/runs/{run_id}', run_id)}</span>"
    return f"<span class=mono>{H.esc(run_id)}</span>"


def model_cell(data: ReportData, row: Any) -> str:
    """A trial's logged model (a row of compare's table): its page in the MLflow UI, named; else its
    models:/ URI; "–" when it has none (never logged, or deleted by retention)."""
    model_id = _py(row.get("model_id")) if row is not None else None
    if not model_id:
        return "–"
    if data.ui_url and data.experiment_id is not None:
        name = _py(row.get("model_name")) or model_id
        return _link(f"{data.ui_url}/#/experiments/{data.experiment_id}/models/{model_id}", name, f"models:/{model_id}")
    return f"<span class=mono>{H.esc(_py(row.get('model_uri')) or f'models:/{model_id}')}</span>"


def trial_row(data: ReportData, number: int):
    """The row of compare's table for this trial (None when the table does not hold it)."""
    t = data.table
    if t is None or t.frame.empty:
        return None
    rows = t.frame[t.frame["trial"] == number]
    return None if rows.empty else rows.iloc[0]


def top_trials(data: ReportData) -> str:
    from hpolab.analysis.compare.render import resource_columns, short_names
    from hpolab.analysis.compare.study import select

    t = data.table
    if t is None or t.frame.empty or not (t.frame["state"] == "COMPLETE").any():
        return H.note("No complete trial yet.")
    df = select(t, state="complete", top=TOP_ROWS)
    shorts = short_names(t.params)
    used = resource_columns(df)  # peak memory and throughput (when the trials recorded them)
    headers = ["trial", *[shorts[p] for p in t.params], f"best {t.metric}", f"final {t.metric}", "epochs", "seconds",
               *[h for _, h in used], "MLflow run", "logged model"]
    numeric = [True, *[True] * len(t.params), True, True, True, True, *[True] * len(used), False, False]
    rows = []
    for _, r in df.iterrows():
        rows.append([
            int(r["trial"]),
            *[_text(_py(r[f"params.{p}"])) for p in t.params],
            _py(r[t.best_col]), _py(r[t.final_col]), _py(r["epochs"]),
            None if _py(r["duration_s"]) is None else round(float(r["duration_s"]), 1),
            *[_py(r[c]) for c, _ in used],
            run_cell(data, r["run_id"]), model_cell(data, r),
        ])
    n_complete = int((t.frame["state"] == "COMPLETE").sum())
    head = f"<p class=\"caption\">Showing {len(rows)} of {n_complete} complete trials. " \
           f"Full table: <code>hpolab compare {H.esc(data.study.study_name)}</code> (add <code>--format csv</code> for every column)." \
           f"{_models_note(data)}</p>"
    return head + H.table(headers, rows, numeric, raw=True)


def _models_note(data: ReportData) -> str:
    if data.ui_url and data.experiment_id is not None:
        tab = f"{data.ui_url}/#/experiments/{data.experiment_id}/models?workflowType=machine_learning"
        return (f" Runs and models link to the MLflow UI at <span class=mono>{H.esc(data.ui_url)}</span>; its "
                f"{_link(tab, 'Models tab')} lists the study's models with their linked metrics side by side.")
    return (" A model is named by its URI (<code>mlflow.pyfunc.load_model(URI)</code>); with "
            "<code>--ui-url</code> (e.g. what <code>hpolab ui</code> serves) the report links each to its page in the MLflow UI.")


def problem_trials(data: ReportData) -> str:
    t = data.table
    if t is None or t.frame.empty:
        return ""
    failed = t.frame[t.frame["state"] == "FAIL"]
    if failed.empty:
        return ""
    rows = [[int(r["trial"]), H.esc(r["fail_reason"] or "(no reason recorded)"), run_cell(data, r["run_id"])] for _, r in failed.iterrows()]
    return "<h3>Failed trials</h3>" + H.table(["trial", "why it failed", "MLflow run"], rows, [True, False, False], raw=True)


def _text(v):
    """A cell of a raw table: strings escaped here (numbers are formatted by the table)."""
    return H.esc(v) if isinstance(v, str) else v


def _py(v):
    from hpolab.analysis.compare.render import json_value

    return json_value(v)
