"""`hpolab report NAME`: one self-contained HTML file about a study, also logged to its parent run.

What it shows, in order: a summary (metric and direction, trial counts, best trial and its params),
the optimization history, every trial's learning curve (pruned trials marked where they stopped),
parameter importances, parallel coordinates, slice plots, the trial timeline, the LR range test
curve (when the study ran one), the top trials table, and the promotion state (which registered
model version holds the `champion` alias, with its test metrics).

It reads the stores and writes nothing but the file (and the artifact on the parent run), so it
works on a study in any state: empty, still running, finished. A plot that cannot be drawn yet (too
few finished trials, nothing sampled) is replaced by a sentence saying why.
"""

from __future__ import annotations

import datetime as dt
import html
import math
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpolab.analysis import report_html as H
from hpolab.stores.paths import Stores

ARTIFACT_DIR = "report"  # on the study's parent run: report/<study>.html
TOP_K = 10
LR_RUN_NAME = "lr-range-test"
STATE_COLORS = {"COMPLETE": "#2b6cb0", "PRUNED": "#dd8a1a", "FAIL": "#c53030", "RUNNING": "#718096", "WAITING": "#a0aec0"}


@dataclass
class ReportData:
    """Everything the page shows, read once from the stores."""

    study: Any  # optuna.Study
    metric: str
    direction: str
    counts: Counter
    client: Any = None  # MlflowClient, None when the tracking store is unreachable
    experiment_id: str | None = None
    parent_run: Any = None
    table: Any = None  # hpolab.analysis.compare.StudyTable
    lr_test: dict[str, Any] | None = None  # {"lr": [...], "loss": [...], "smoothed": [...], "attr": {...}, "run_id": ...}
    promotion: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # what could not be read (shown in the footer)

    @property
    def finished(self) -> int:
        return self.counts["COMPLETE"] + self.counts["PRUNED"] + self.counts["FAIL"]


# ---------------------------------------------------------------- reading the stores


def gather(study, stores: Stores | None = None, client=None) -> ReportData:
    from hpolab.analysis.compare import study_frame, study_metric

    problems: list[str] = []
    experiment_id, parent = None, None
    if client is None and stores is not None:
        try:
            from hpolab.analysis.compare import tracking_client

            client = tracking_client(stores)
        except Exception as e:  # the report still has Optuna's side
            problems.append(f"MLflow tracking store not readable: {e}")
    if client is not None:
        try:
            exp = client.get_experiment_by_name(study.study_name)
            experiment_id = exp.experiment_id if exp is not None else None
        except Exception as e:
            problems.append(f"MLflow experiment lookup failed: {e}")
        parent_id = study.user_attrs.get("mlflow_parent_run_id")
        if parent_id:
            try:
                parent = client.get_run(parent_id)
            except Exception:
                problems.append(f"the study's parent run {parent_id} is not in the tracking store")
    metric = study_metric(study, client, experiment_id)
    table = study_frame(study, client, experiment_id, metric=metric)
    counts = Counter(t.state.name for t in study.get_trials(deepcopy=False))
    data = ReportData(study, metric, study.direction.name.lower(), counts, client, experiment_id, parent, table, problems=problems)
    data.lr_test = _lr_test(study, client, experiment_id, problems)
    data.promotion = _promotion(study.study_name, client, problems)
    return data


def _lr_test(study, client, experiment_id: str | None, problems: list[str]) -> dict[str, Any] | None:
    """The LR range test's curve, from its MLflow run (metrics lr_test_* with step = sweep step)."""
    attr = study.user_attrs.get("lr_range_test") or None
    run_id = (attr or {}).get("mlflow_run_id")
    if client is None:
        return {"attr": attr, "run_id": None, "lr": [], "loss": [], "smoothed": []} if attr else None
    try:
        if not run_id and experiment_id is not None:
            runs = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.runName` = '{LR_RUN_NAME}'",
                                      order_by=["attributes.start_time DESC"], max_results=1)
            run_id = runs[0].info.run_id if runs else None
        if not run_id:
            return {"attr": attr, "run_id": None, "lr": [], "loss": [], "smoothed": []} if attr else None
        series = {}
        for name in ("lr_test_lr", "lr_test_loss", "lr_test_smoothed_loss"):
            series[name] = {m.step: m.value for m in client.get_metric_history(run_id, name)}
        steps = sorted(set(series["lr_test_lr"]) & set(series["lr_test_loss"]))
        params = client.get_run(run_id).data.params
    except Exception as e:
        problems.append(f"LR range test run not readable: {e}")
        return {"attr": attr, "run_id": run_id, "lr": [], "loss": [], "smoothed": []} if attr else None
    return {
        "attr": attr,
        "run_id": run_id,
        "params": params,
        "lr": [series["lr_test_lr"][s] for s in steps],
        "loss": [series["lr_test_loss"][s] for s in steps],
        "smoothed": [series["lr_test_smoothed_loss"].get(s) for s in steps],
    }


def _promotion(name: str, client, problems: list[str]) -> dict[str, Any]:
    """The registry state: the registered model named like the study, its versions and aliases."""
    if client is None:
        return {"state": "unknown"}
    from mlflow.exceptions import MlflowException

    model = None
    try:
        model = client.get_registered_model(name)
    except MlflowException as e:
        if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            problems.append(f"model registry not readable: {e}")
            return {"state": "unknown"}
    except Exception as e:
        problems.append(f"model registry not readable: {e}")
        return {"state": "unknown"}
    if model is None:
        # `hpolab promote --model-name X` registers under another name; its versions carry the study.
        try:
            tagged = list(client.search_model_versions(f"tags.`hpolab.study` = '{name}'"))
            if tagged:
                name = tagged[0].name
                model = client.get_registered_model(name)
        except Exception:
            pass
    if model is None:
        return {"state": "none"}
    aliases = dict(getattr(model, "aliases", {}) or {})
    try:
        versions = list(client.search_model_versions(f"name = '{name}'"))
    except Exception as e:
        problems.append(f"model versions not readable: {e}")
        versions = []
    versions.sort(key=lambda v: int(v.version), reverse=True)
    by_version = {str(v.version): [a for a, n in aliases.items() if str(n) == str(v.version)] for v in versions}
    champion = None
    if "champion" in aliases:
        try:
            champion = client.get_model_version_by_alias(name, "champion")
        except Exception as e:
            problems.append(f"champion version not readable: {e}")
    return {"state": "registered", "name": name, "model": model, "aliases": aliases, "versions": versions, "version_aliases": by_version, "champion": champion}


# ---------------------------------------------------------------- figures


def _quiet():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # "study has no trials"-style warnings: the page says it
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _complete(data: ReportData) -> list:
    from optuna.trial import TrialState

    return data.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def _varying_params(trials) -> list[str]:
    values: dict[str, set] = {}
    for t in trials:
        for k, v in t.params.items():
            values.setdefault(k, set()).add(repr(v))
    return sorted(k for k, vs in values.items() if len(vs) > 1)


def fig_history(data: ReportData) -> tuple[Any, str | None]:
    if not _complete(data):
        return None, "No complete trial yet: the history starts with the first complete trial."
    from optuna.visualization import plot_optimization_history

    fig = plot_optimization_history(data.study, target_name=data.metric)
    fig.update_layout(title=None, xaxis_title="trial number", yaxis_title=data.metric)
    fig.update_xaxes(tickformat="d", dtick=1 if len(data.study.trials) <= 20 else None)
    return fig, None


def fig_learning_curves(data: ReportData) -> tuple[Any, str | None]:
    import plotly.graph_objects as go

    trials = [t for t in data.study.get_trials(deepcopy=False) if t.intermediate_values]
    if not trials:
        return None, "No trial has reported an epoch yet."
    best_number = _best_number(data)
    fig = go.Figure()
    shown: set[str] = set()
    for t in trials:
        state = t.state.name
        steps, values = zip(*sorted(t.intermediate_values.items()))
        is_best = t.number == best_number
        fig.add_trace(
            go.Scatter(
                x=list(steps), y=list(values), mode="lines+markers",
                name=state.lower(), legendgroup=state, showlegend=state not in shown,
                line={"color": STATE_COLORS.get(state, "#718096"), "width": 3.5 if is_best else 1.5,
                      "dash": "dot" if state in ("RUNNING", "WAITING") else "solid"},
                marker={"size": 5}, opacity=1.0 if is_best or state != "COMPLETE" else 0.75,
                hovertemplate=f"trial {t.number} ({state.lower()})<br>epoch %{{x}}<br>{data.metric} %{{y:.4g}}<extra></extra>",
            )
        )
        shown.add(state)
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    if pruned:
        fig.add_trace(
            go.Scatter(
                x=[max(t.intermediate_values) for t in pruned],
                y=[t.intermediate_values[max(t.intermediate_values)] for t in pruned],
                mode="markers", name="pruned here",
                marker={"symbol": "x", "size": 13, "color": STATE_COLORS["PRUNED"], "line": {"width": 2}},
                hovertemplate="trial %{text} pruned after epoch %{x}<extra></extra>", text=[str(t.number) for t in pruned],
            )
        )
    if best_number is not None:
        b = data.study.trials[best_number]
        if b.intermediate_values:
            last = max(b.intermediate_values)
            fig.add_annotation(x=last, y=b.intermediate_values[last], text=f"best: trial {best_number}", showarrow=True, arrowhead=2)
    fig.update_layout(xaxis_title="epoch", yaxis_title=data.metric, legend={"title": "trial state"})
    last_epoch = max(max(t.intermediate_values) for t in trials)
    fig.update_xaxes(tickformat="d", dtick=1 if last_epoch <= 20 else None)
    return fig, None


def _best_number(data: ReportData) -> int | None:
    try:
        return data.study.best_trial.number
    except ValueError:
        return None


def fig_importances(data: ReportData) -> tuple[Any, str | None]:
    complete = _complete(data)
    if len(complete) < 2:
        return None, f"Parameter importances need at least 2 complete trials; this study has {len(complete)}."
    if not _varying_params(complete):
        return None, "No sampled parameter varies across the complete trials, so there is nothing to rank."
    from optuna.importance import FanovaImportanceEvaluator
    from optuna.visualization import plot_param_importances

    try:
        fig = plot_param_importances(data.study, evaluator=FanovaImportanceEvaluator(seed=0), target_name=data.metric)
    except Exception as e:  # e.g. a search space that changed between trials
        return None, f"Parameter importances could not be computed: {html.escape(str(e))}"
    fig.update_layout(title=None)
    return fig, None


def fig_parallel(data: ReportData) -> tuple[Any, str | None]:
    complete = _complete(data)
    if len(complete) < 2 or not _varying_params(complete):
        return None, f"Parallel coordinates need at least 2 complete trials with sampled parameters; this study has {len(complete)} complete."
    from optuna.visualization import plot_parallel_coordinate

    fig = plot_parallel_coordinate(data.study, target_name=data.metric)
    fig.update_layout(title=None)
    return fig, None


def fig_slice(data: ReportData) -> tuple[Any, str | None]:
    complete = _complete(data)
    params = sorted({p for t in complete for p in t.params})
    if not complete or not params:
        return None, "Slice plots need at least one complete trial with sampled parameters."
    from optuna.visualization import plot_slice

    fig = plot_slice(data.study, target_name=data.metric)
    fig.update_layout(title=None, height=380)
    return fig, None


def fig_timeline(data: ReportData) -> tuple[Any, str | None]:
    if not data.study.get_trials(deepcopy=False):
        return None, "No trial has started yet."
    from optuna.visualization import plot_timeline

    fig = plot_timeline(data.study)
    fig.update_layout(title=None, height=max(260, 60 + 22 * len(data.study.trials)))
    return fig, None


def fig_lr_test(data: ReportData) -> tuple[Any, str | None]:
    lt = data.lr_test
    if lt is None:
        return None, "This study ran no LR range test (enable <code>lr_range_test</code> in the spec, or run <code>hpolab lr-find SPEC</code>)."
    if not lt["lr"]:
        return None, "The study has LR range test bounds, but the test's curve is not in the tracking store."
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_trace(go.Scatter(x=lt["lr"], y=lt["loss"], mode="lines", name="loss", line={"color": "#a0aec0", "width": 1}))
    if any(v is not None for v in lt["smoothed"]):
        fig.add_trace(go.Scatter(x=lt["lr"], y=lt["smoothed"], mode="lines", name="smoothed loss", line={"color": "#2b6cb0", "width": 2.5}))
    attr = lt.get("attr") or {}

    def label(x: float, text: str, color: str, y: float) -> None:
        # Annotations on a log axis take log10(x) (shapes take x itself).
        fig.add_annotation(x=math.log10(x), y=y, yref="paper", text=text, showarrow=False, font={"color": color, "size": 12},
                           xanchor="left", yanchor="bottom", xshift=4)

    if attr.get("low") and attr.get("high"):
        fig.add_vrect(x0=attr["low"], x1=attr["high"], fillcolor="#48bb78", opacity=0.15, line_width=0)
        label(attr["low"], f"LR search range {attr['low']:.2g} – {attr['high']:.2g}", "#2f855a", 1.0)
    if attr.get("suggestion"):
        fig.add_vline(x=attr["suggestion"], line_dash="dash", line_color="#2f855a")
        label(attr["suggestion"], f"suggested {attr['suggestion']:.3g}", "#2f855a", 0.02)
    if attr.get("diverged_at_lr"):
        fig.add_vline(x=attr["diverged_at_lr"], line_dash="dot", line_color=STATE_COLORS["FAIL"])
        label(attr["diverged_at_lr"], "diverged", STATE_COLORS["FAIL"], 0.5)
    finite = [v for v in (lt["smoothed"] if any(v is not None for v in lt["smoothed"]) else lt["loss"]) if v is not None and math.isfinite(v)]
    if finite:  # the curve explodes at the end by design; keep the interesting part in view
        lo, best = min(finite), finite[0]
        fig.update_yaxes(range=[lo - 0.1 * abs(best - lo + 1e-9), max(best, lo) * 1.5 + 1e-9])
    fig.update_layout(xaxis_type="log", xaxis_title="learning rate (log scale)", yaxis_title="training loss")
    return fig, None


PLOTS = [
    ("optimization-history", "Optimization history", fig_history,
     "Each dot is one complete trial's {metric} in the order the trials ran; the line is the best value so far. "
     "A line that is still climbing (or falling, for a minimized metric) means more trials would likely help."),
    ("learning-curves", "Learning curves", fig_learning_curves,
     "{metric} after every epoch, one line per trial, coloured by how the trial ended. An orange × marks where the "
     "pruner stopped a trial early because it looked unpromising at that epoch; the thick line is the best trial."),
    ("param-importances", "Parameter importances", fig_importances,
     "How much of the variation in {metric} each sampled parameter explains (fANOVA over the complete trials). "
     "With few trials this is a rough hint, not a measurement."),
    ("parallel-coordinates", "Parallel coordinates", fig_parallel,
     "Every complete trial is one line through its parameter values, coloured by {metric}. Look for ranges where the "
     "best-coloured lines bunch together."),
    ("slice", "Slice plots", fig_slice,
     "{metric} against each parameter on its own, one dot per complete trial (darker = later trial). "
     "A clear trend or optimum inside the range suggests the range is right; an optimum at the edge suggests widening it."),
    ("timeline", "Trial timeline", fig_timeline,
     "When each trial ran, coloured by its state. Overlapping bars are trials that ran in parallel; red bars failed."),
    ("lr-range-test", "LR range test", fig_lr_test,
     "Training loss while the learning rate grows exponentially over one short run (Leslie Smith's range test). "
     "The loss falls fastest a little below the LR where it bottoms out; the shaded band is the LR search range derived from it."),
]


# ---------------------------------------------------------------- page


def _when(t: dt.datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else "–"


def _summary(data: ReportData) -> str:
    s = data.study
    c = data.counts
    trials = s.get_trials(deepcopy=False)
    budget = None
    if data.parent_run is not None:
        try:
            # The driver tags the budget of its latest run (params are write-once: the first spec's).
            budget = int(data.parent_run.data.tags.get("hpolab.n_trials") or data.parent_run.data.params.get("n_trials", ""))
        except ValueError:
            budget = None
    finished = data.finished
    if budget is not None and budget >= finished:
        done = f"{finished} <small>of {budget} (budget)</small>"
    else:
        done = f"{finished}"
    running = c["RUNNING"] + c["WAITING"]
    if running:
        status = f"running <small>({running} trial{'s' * (running > 1)} in progress)</small>"
    elif budget is not None and finished >= budget:
        status = "finished <small>(budget reached)</small>"
    elif trials:
        status = "stopped <small>(re-run to continue)</small>" if budget and finished < budget else "idle"
    else:
        status = "empty"
    best = _best_number(data)
    direction = "higher is better" if data.direction == "maximize" else "lower is better"
    items = [
        ("status", status),
        ("metric", f"{H.esc(data.metric)} <small>{data.direction} ({direction})</small>"),
        ("trials finished", done),
        ("complete / pruned / failed",
         f"<span class=state-COMPLETE>{c['COMPLETE']}</span> / <span class=state-PRUNED>{c['PRUNED']}</span> / "
         f"<span class=state-FAIL>{c['FAIL']}</span>"),
    ]
    if best is not None:
        items.append(("best " + data.metric, f"{H.fmt_num(s.best_value)} <small>trial {best}</small>"))
    out = [f"<h1>Study {H.esc(s.study_name)}</h1>"]
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    span = f"trials ran from {_when(min(starts))} to {_when(max(ends) if ends else None)}" if starts else "no trial has started"
    out.append(f"<p class=\"sub\">Hyperparameter study report &middot; {span} &middot; generated {_when(dt.datetime.now())}</p>")
    out.append(H.cards(items))
    if finished == 0:
        out.append(H.note("<b>No finished trials yet.</b> The plots below fill in as trials finish; "
                          "run <code>hpolab study run SPEC</code>, then <code>hpolab report</code> again.", warn=True))
    elif finished == 1:
        out.append(H.note("<b>Only one finished trial.</b> Comparisons, importances and trends need more trials; "
                          "what is shown below is that one trial.", warn=True))
    if running:
        out.append(H.note(f"This study was still running when the report was made ({running} trial"
                          f"{'s' * (running > 1)} in progress); their curves are dotted and may be incomplete."))
    if best is not None:
        bt = s.best_trial
        rows = [(k, H.fmt_num(v) if isinstance(v, float) else v) for k, v in sorted(bt.params.items())]
        run = bt.user_attrs.get("mlflow_run_id")
        out.append(f"<h3>Best trial: {best} &mdash; {H.esc(data.metric)} = {H.fmt_num(bt.value, 6)}</h3>")
        if rows:
            out.append(H.table(["parameter", "value"], rows))
        if run:
            out.append(f"<p class=\"caption\">MLflow run <span class=\"mono\">{H.esc(run)}</span>"
                       f"{' &middot; model <span class=mono>' + H.esc(bt.user_attrs.get('model_uri', '')) + '</span>' if bt.user_attrs.get('model_uri') else ''}</p>")
    elif finished:
        out.append(H.note("No trial has completed yet (all finished trials were pruned or failed), so there is no best trial."))
    return "\n".join(out)


def _top_trials(data: ReportData) -> str:
    from hpolab.analysis.compare import select, short_names

    t = data.table
    if t is None or t.frame.empty or not (t.frame["state"] == "COMPLETE").any():
        return H.note("No complete trial yet.")
    df = select(t, state="complete", top=TOP_K)
    shorts = short_names(t.params)
    headers = ["trial", *[shorts[p] for p in t.params], f"best {t.metric}", f"final {t.metric}", "epochs", "seconds", "MLflow run"]
    numeric = [True, *[True] * len(t.params), True, True, True, True, False]
    rows = []
    for _, r in df.iterrows():
        rows.append([
            int(r["trial"]),
            *[_py(r[f"params.{p}"]) for p in t.params],
            _py(r[t.best_col]), _py(r[t.final_col]), _py(r["epochs"]),
            None if _py(r["duration_s"]) is None else round(float(r["duration_s"]), 1),
            r["run_id"] or "–",
        ])
    n_complete = int((t.frame["state"] == "COMPLETE").sum())
    head = f"<p class=\"caption\">Showing {len(rows)} of {n_complete} complete trials. " \
           f"Full table: <code>hpolab compare {H.esc(data.study.study_name)}</code> (add <code>--format csv</code> for every column).</p>"
    return head + H.table(headers, rows, numeric)


def _problem_trials(data: ReportData) -> str:
    t = data.table
    if t is None or t.frame.empty:
        return ""
    failed = t.frame[t.frame["state"] == "FAIL"]
    if failed.empty:
        return ""
    rows = [[int(r["trial"]), r["fail_reason"] or "(no reason recorded)", r["run_id"] or "–"] for _, r in failed.iterrows()]
    return "<h3>Failed trials</h3>" + H.table(["trial", "why it failed", "MLflow run"], rows, [True, False, False])


def _py(v):
    from hpolab.analysis.compare import json_value

    return json_value(v)


def _promotion_html(data: ReportData) -> str:
    p = data.promotion
    name = H.esc(data.study.study_name)
    if p.get("state") == "unknown":
        return H.note("The model registry could not be read, so the promotion state is unknown.", warn=True)
    if p.get("state") == "none":
        return H.note(f"Not promoted yet: there is no registered model named <b>{name}</b>. "
                      f"Run <code>hpolab promote {name}</code> to evaluate the best trial on the held-out test split "
                      "and register it as the <code>champion</code>.")
    out = []
    name = H.esc(p.get("name") or data.study.study_name)
    champ = p.get("champion")
    if champ is not None:
        tags = dict(champ.tags or {})
        trial = _version_trial(data, champ)
        # numeric test results only (promote also records e.g. a fingerprint of the test split)
        test = {k.removeprefix("hpolab."): v for k, v in tags.items() if "test" in k.lower() and _is_float(v)}
        main = _main_test_metric(test, data.metric, tags.get("hpolab.gate_metric"))
        line = f"<b>Champion: {name} version {H.esc(champ.version)}</b>"
        if trial is not None:
            line += f", from trial {trial}"
        if main:
            line += f" &mdash; {H.esc(main[0])} = <b>{H.esc(_fmt_tag(main[1]))}</b> on the held-out test split"
        out.append(f"<p>{line}</p>")
        rows = [(k, _fmt_tag(v)) for k, v in sorted(test.items())]
        if rows:
            out.append(H.table(["test metric", "value"], rows))
        if champ.description:
            out.append(f"<p class=\"caption\">{H.esc(champ.description)}</p>")
        out.append(f"<p class=\"caption\">model URI <span class=mono>models:/{name}@champion</span></p>")
    else:
        out.append(H.note(f"The registered model <b>{name}</b> exists but no version holds the <code>champion</code> alias."))
    versions = p.get("versions") or []
    if versions:
        rows = []
        for v in versions[:20]:
            aliases = ", ".join(p["version_aliases"].get(str(v.version), [])) or "–"
            created = dt.datetime.fromtimestamp(v.creation_timestamp / 1000) if v.creation_timestamp else None
            gate = (v.tags or {}).get("hpolab.gate_metric")
            test_value = (v.tags or {}).get(f"hpolab.{gate}") if gate else None
            rows.append([v.version, aliases, _version_trial(data, v), f"{gate} {_fmt_tag(test_value)}" if test_value else "–", _when(created)])
        out.append("<h3>Registered versions</h3>")
        out.append(H.table(["version", "aliases", "trial", "test metric", "registered"], rows, [True, False, True, False, False]))
    return "\n".join(out)


def _version_trial(data: ReportData, version) -> int | None:
    """The trial a registered version came from: its lineage tag, else its run."""
    tags = version.tags or {}
    try:
        return int(tags["hpolab.trial_number"])
    except (KeyError, ValueError):
        return _trial_of_run(data, tags.get("hpolab.trial_run_id") or version.run_id)


def _fmt_tag(v: str) -> str:
    try:
        return H.fmt_num(float(v), 5)
    except (TypeError, ValueError):
        return str(v)


def _main_test_metric(test: dict[str, str], metric: str, gate: str | None = None) -> tuple[str, str] | None:
    """The test metric to headline: the promotion gate's, else the one matching the study metric."""
    base = metric.removeprefix("val_")
    for key in (gate, f"test_{base}", f"test_{metric}"):
        if key and key in test:
            return key, test[key]
    numeric = [(k, v) for k, v in sorted(test.items()) if _is_float(v)]
    return numeric[0] if numeric else None


def _is_float(v: Any) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def _trial_of_run(data: ReportData, run_id: str | None) -> int | None:
    if not run_id:
        return None
    for t in data.study.get_trials(deepcopy=False):
        if t.user_attrs.get("mlflow_run_id") == run_id:
            return t.number
    return None


def render(data: ReportData) -> str:
    from plotly.offline import get_plotlyjs

    _quiet()
    parts = [_summary(data)]
    toc = [(k, title) for k, title, _, _ in PLOTS] + [("top-trials", "Top trials"), ("promotion", "Promotion")]
    parts.append("<nav class=\"toc\">" + "".join(f"<a href=\"#{k}\">{H.esc(t)}</a>" for k, t in toc) + "</nav>")
    for key, title, make, caption in PLOTS:
        try:
            fig, why = make(data)
        except Exception as e:  # one plot must never cost the whole report
            fig, why = None, f"This plot failed: {html.escape(type(e).__name__ + ': ' + str(e))}"
        content = H.figure(fig, key) if fig is not None else H.note(why)
        parts.append(H.section(key, title, html.escape(caption.format(metric=data.metric)), content))
    parts.append(H.section("top-trials", "Top trials", f"The best complete trials by {H.esc(data.metric)} ({data.direction}).",
                           _top_trials(data) + _problem_trials(data)))
    parts.append(H.section("promotion", "Promotion",
                           "Which trained model is promoted: the MLflow Model Registry entry named like the study, and the "
                           "version holding the <code>champion</code> alias with its held-out test metrics.",
                           _promotion_html(data)))
    footer = [f"Optuna study <b>{H.esc(data.study.study_name)}</b>"]
    if data.parent_run is not None:
        footer.append(f"MLflow parent run <span class=mono>{H.esc(data.parent_run.info.run_id)}</span>")
    footer += [H.esc(p) for p in data.problems]
    parts.append("<footer>" + " &middot; ".join(footer) + "</footer>")
    return H.page(f"Study {data.study.study_name} — hpolab report", "\n".join(parts), get_plotlyjs())


# ---------------------------------------------------------------- command


def write_report(name: str, stores: Stores, out: Path | None = None) -> tuple[Path, ReportData]:
    from hpolab.stores.optuna_storage import load_study

    study = load_study(name, stores)
    data = gather(study, stores)
    out = Path(out) if out else stores.root / "reports" / f"{name}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(data), encoding="utf-8")
    return out, data


def log_report(data: ReportData, path: Path) -> str | None:
    """Log the report on the study's parent run as report/<study>.html; returns the artifact path."""
    if data.client is None or data.parent_run is None:
        return None
    run_id = data.parent_run.info.run_id
    artifact_name = f"{data.study.study_name}.html"
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / artifact_name
        p.write_bytes(Path(path).read_bytes())
        data.client.log_artifact(run_id, str(p), ARTIFACT_DIR)
    return f"{ARTIFACT_DIR}/{artifact_name}"


def report_cmd(args, stores: Stores) -> int:
    out, data = write_report(args.name, stores, Path(args.out) if args.out else None)
    print(f"report: {out}")
    if data.finished < 2:
        print(f"note: the study has {data.finished} finished trial{'s' * (data.finished != 1)}; the report says what is missing")
    try:
        artifact = log_report(data, out)
    except Exception as e:  # the local file is the main product; say why MLflow did not get a copy
        print(f"warning: could not log the report to MLflow: {e}")
        return 0
    if artifact:
        print(f"logged to MLflow: run {data.parent_run.info.run_id}, artifact {artifact} (open it with `hpolab ui`)")
    else:
        print("not logged to MLflow: the study has no parent run in the tracking store")
    return 0
