"""The report's plotly figures: each `fig_*` takes the ReportData and returns (figure, None), or
(None, a sentence saying why the plot cannot be drawn yet). `PLOTS` lists them in page order with
their titles and captions.
"""

from __future__ import annotations

import html
import math
import warnings
from typing import Any

from hpolab.analysis.report.data import ReportData, best_number
from hpolab.analysis.report.race import add_noise_band
from hpolab.stores.trial_states import last_pause

STATE_COLORS = {"COMPLETE": "#2b6cb0", "PRUNED": "#dd8a1a", "FAIL": "#c53030", "RUNNING": "#718096", "WAITING": "#a0aec0"}


def quiet():
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


def _multi(data: ReportData) -> bool:
    return len(data.study.directions) > 1


def _target(data: ReportData) -> dict[str, Any]:
    """Optuna's one-value plots: the trial's value, or (several objectives) the pruning metric's
    recorded value -- Optuna needs a `target` for a multi-objective study."""
    if not _multi(data):
        return {"target_name": data.metric}
    from hpolab.study.objectives.objective_values import VALUES_ATTR

    return {"target_name": data.metric, "target": lambda t: float((t.user_attrs.get(VALUES_ATTR) or {}).get(data.metric, math.nan))}


def _objective_names(data: ReportData) -> list[str]:
    return data.study.metric_names or [f"objective {i}" for i in range(len(data.study.directions))]


def fig_pareto(data: ReportData) -> tuple[Any, str | None]:
    """Several objectives: every COMPLETE trial in objective space, the feasible front drawn
    (2 or 3 objectives; any number: fig_objectives, the objectives' parallel coordinates)."""
    if not _multi(data):
        return None, "This study has one objective; see the optimization history."
    names = _objective_names(data)
    if len(names) > 3:
        return None, (f"{len(names)} objectives: a front of more than 3 cannot be drawn as a scatter; see the objectives' "
                      "parallel coordinates below (one axis per objective, the front highlighted).")
    if not _complete(data):
        return None, "No complete trial yet."
    from optuna.visualization import plot_pareto_front

    fig = plot_pareto_front(data.study, target_names=names, include_dominated_trials=True)
    fig.update_layout(title=None)
    return fig, None


# The objectives' parallel coordinates: each COMPLETE trial's colour by kind -- 0 infeasible, 1 feasible but
# dominated, 2 on the feasible Pareto front, 3 the front's knee. Lines are drawn in that order (the front on top).
KIND_COLORS = ("#c53030", "#a0aec0", "#2b6cb0", "#2f855a")


def fig_objectives(data: ReportData) -> tuple[Any, str | None]:
    """Several objectives, any number of them: one axis per objective (its direction in the label), one
    line per COMPLETE trial of this study, coloured by kind (KIND_COLORS)."""
    if not _multi(data):
        return None, "This study has one objective; see the optimization history."
    from hpolab.study.objectives import ranking
    from hpolab.stores.trial_states import is_imported

    directions = ranking.directions_of(data.study)
    trials = [t for t in _complete(data) if t.values is not None and len(t.values) == len(directions)
              and not is_imported(t)]  # (a warm start's imported trials are not this study's results)
    if not trials:
        return None, "No complete trial yet."
    marks = ranking.front_marks(trials, directions)  # trial number -> "knee" / "yes": the feasible front
    kind = {t.number: 3 if marks.get(t.number) == "knee" else 2 if t.number in marks else int(ranking.feasible(t)) for t in trials}
    trials.sort(key=lambda t: (kind[t.number], t.number))
    knee = [n for n, m in marks.items() if m == "knee"]
    n_kind = [list(kind.values()).count(k) for k in range(4)]
    labels = [f"infeasible ({n_kind[0]})", f"feasible, dominated ({n_kind[1]})", f"Pareto front ({len(marks)})",
              f"knee: trial {knee[0]}" if knee else "knee: none"]
    import plotly.graph_objects as go

    fig = go.Figure(go.Parcoords(
        dimensions=[{"label": f"{name} ({d[:3]})", "values": [t.values[i] for t in trials]}
                    for i, (name, d) in enumerate(zip(_objective_names(data), directions))],
        line={"color": [kind[t.number] for t in trials], "cmin": -0.5, "cmax": 3.5, "showscale": True,
              "colorscale": [[edge, c] for k, c in enumerate(KIND_COLORS) for edge in (k / 4, (k + 1) / 4)],
              "colorbar": {"tickvals": [0, 1, 2, 3], "ticktext": labels, "title": {"text": "trials"}}},
    ))
    return fig, None


def fig_hypervolume(data: ReportData) -> tuple[Any, str | None]:
    if not _multi(data):
        return None, "This study has one objective; see the optimization history."
    from hpolab.study.objectives import ranking

    history = ranking.hypervolume_history(data.study.get_trials(deepcopy=False), ranking.directions_of(data.study))
    if len(history) < 2:
        return None, "The hypervolume needs at least 2 feasible complete trials."
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[n for n, _ in history], y=[hv for _, hv in history], mode="lines+markers", name="hypervolume"))
    fig.update_layout(xaxis_title="trial number", yaxis_title="hypervolume of the front")
    return fig, None


def fig_history(data: ReportData) -> tuple[Any, str | None]:
    if not _complete(data):
        return None, "No complete trial yet: the history starts with the first complete trial."
    from optuna.visualization import plot_optimization_history

    fig = plot_optimization_history(data.study, **_target(data))
    add_noise_band(fig, data)  # a measured noise floor: the values within it of the best (report/race.py)
    fig.update_layout(title=None, xaxis_title="trial number", yaxis_title=data.metric)
    fig.update_xaxes(tickformat="d", dtick=1 if len(data.study.trials) <= 20 else None)
    return fig, None


# Curves drawn one by one (hover per trial); the others of a state share one faint trace, so the
# page of a study of thousands of trials stays a few MB.
FULL_CURVES = 20


def _summarised_curves(fig, rest: list) -> None:
    """The curves not drawn one by one: one faint trace per state (gaps between trials), no hover."""
    import plotly.graph_objects as go

    for state in dict.fromkeys(t.state.name for t in rest):
        xs, ys, n = [], [], 0
        for t in rest:
            if t.state.name == state:
                steps, values = zip(*sorted(t.intermediate_values.items()))
                xs, ys, n = xs + [*steps, None], ys + [*values, None], n + 1
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"{state.lower()} ({n}, not in the top {FULL_CURVES})",
                                 legendgroup=state, line={"color": STATE_COLORS.get(state, "#718096"), "width": 1},
                                 marker={"size": 3}, opacity=0.35, hoverinfo="skip"))


def _curve_trials(data: ReportData) -> list:
    """The trials with their epochs' values. Several objectives: those values were reported to the
    companion pruning study (study/objectives/pruning.py), matched back by its `hpolab.trial` attr."""
    trials = data.study.get_trials(deepcopy=False)
    if not _multi(data):
        return trials
    from types import SimpleNamespace

    import optuna

    from hpolab.stores.studies import COMPANION_SUFFIX

    try:
        companion = optuna.load_study(study_name=data.study.study_name + COMPANION_SUFFIX, storage=data.study._storage)
    except KeyError:
        return []
    curves = {c.user_attrs.get("hpolab.trial"): c.intermediate_values for c in companion.get_trials(deepcopy=False)}
    return [SimpleNamespace(number=t.number, state=t.state, values=t.values, constraints=t.constraints,
                            system_attrs=t.system_attrs, intermediate_values=curves.get(t.number) or {}) for t in trials]


def _rung_lines(fig, trials) -> None:
    """A trial scheduler's rungs (ASHA): a dotted line at each epoch trials paused at."""
    paused = [last_pause(t) for t in trials]
    for epoch in sorted({int(p["epoch"]) for p in paused if p is not None}):
        fig.add_vline(x=epoch, line={"dash": "dot", "width": 1, "color": "#a0aec0"}, annotation_text=f"rung: epoch {epoch}")


def fig_learning_curves(data: ReportData) -> tuple[Any, str | None]:
    import plotly.graph_objects as go

    from hpolab.study.objectives.ranking import top_k

    trials = [t for t in _curve_trials(data) if t.intermediate_values]
    if not trials:
        return None, "No trial has reported an epoch yet."
    best = best_number(data)
    ranked_by = [d.name.lower() for d in data.study.directions] if _multi(data) else data.direction
    full = set(top_k(trials, FULL_CURVES, ranked_by)) | {t.number for t in trials if t.state.name in ("RUNNING", "WAITING")}
    fig = go.Figure()
    _summarised_curves(fig, [t for t in trials if t.number not in full])
    shown: set[str] = set()
    for t in trials:
        if t.number not in full:
            continue
        state = t.state.name
        steps, values = zip(*sorted(t.intermediate_values.items()))
        is_best = t.number == best
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
    if best is not None:
        b = next(t for t in trials if t.number == best) if best in full else None
        if b is not None and b.intermediate_values:
            last = max(b.intermediate_values)
            fig.add_annotation(x=last, y=b.intermediate_values[last], text=f"best: trial {best}", showarrow=True, arrowhead=2)
    _rung_lines(fig, trials)
    fig.update_layout(xaxis_title="epoch", yaxis_title=data.metric, legend={"title": "trial state"})
    last_epoch = max(max(t.intermediate_values) for t in trials)
    fig.update_xaxes(tickformat="d", dtick=1 if last_epoch <= 20 else None)
    return fig, None


def fig_importances(data: ReportData) -> tuple[Any, str | None]:
    complete = _complete(data)
    if len(complete) < 2:
        return None, f"Parameter importances need at least 2 complete trials; this study has {len(complete)}."
    if not _varying_params(complete):
        return None, "No sampled parameter varies across the complete trials, so there is nothing to rank."
    from optuna.importance import FanovaImportanceEvaluator
    from optuna.visualization import plot_param_importances

    try:
        # 16 trees of depth <= 6 instead of 64 unbounded ones: the cost stops growing with the number
        # of trials. On 1,000 real trials: 0.34 s instead of 48 s (depth 8: 2.4 s), every
        # importance within 0.02 of the default forest's, the same ranking.
        evaluator = FanovaImportanceEvaluator(n_trees=16, max_depth=6, seed=0)
        fig = plot_param_importances(data.study, evaluator=evaluator, **_target(data))
    except Exception as e:  # e.g. a search space that changed between trials
        return None, f"Parameter importances could not be computed: {html.escape(str(e))}"
    fig.update_layout(title=None)
    return fig, None


def fig_parallel(data: ReportData) -> tuple[Any, str | None]:
    """The metric and each sampled parameter that varies, one line per COMPLETE trial: one plotly
    Parcoords trace (Optuna 5's plot draws one Scatter per trial: 1,000 trials took 1.3 s)."""
    complete = _complete(data)
    params = _varying_params(complete)
    target = _target(data).get("target") or (lambda t: t.value)
    trials = [t for t in complete if all(p in t.params for p in params) and math.isfinite(target(t))]
    if len(trials) < 2 or not params:
        return None, f"Parallel coordinates need at least 2 complete trials with sampled parameters; this study has {len(complete)} complete."
    import plotly.graph_objects as go

    values = [target(t) for t in trials]
    dims = [{"label": data.metric, "values": values}] + [_axis(p, [t.params[p] for t in trials], trials[-1].distributions.get(p))
                                                         for p in params]
    fig = go.Figure(go.Parcoords(dimensions=dims, line={"color": values, "colorscale": "Blues", "showscale": True,
                                                        "reversescale": data.direction == "minimize",
                                                        "colorbar": {"title": {"text": data.metric}, "x": 1.1}}))
    return fig, None


def _axis(name: str, values: list, dist) -> dict[str, Any]:
    """One parameter's Parcoords axis: numbers as they are (log-sampled ones on a log10 axis),
    anything else as its choices in the distribution's order."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        if getattr(dist, "log", False) and min(values) > 0:
            logs = [math.log10(v) for v in values]
            ticks = [(k + math.log10(m), f"{m}e{k}") for k in range(math.floor(min(logs)), math.ceil(max(logs)) + 1) for m in (1, 3)]
            ticks = [(x, text) for x, text in ticks if min(logs) <= x <= max(logs)]  # (ticks outside stretch the axis)
            return {"label": name, "values": logs, "tickvals": [x for x, _ in ticks], "ticktext": [text for _, text in ticks]}
        return {"label": name, "values": values}
    labels = [str(c) for c in getattr(dist, "choices", ())] or sorted({str(v) for v in values})
    index = {label: i for i, label in enumerate(labels)}
    return {"label": name, "values": [index[str(v)] for v in values], "tickvals": list(range(len(labels))), "ticktext": labels}


def fig_slice(data: ReportData) -> tuple[Any, str | None]:
    complete = _complete(data)
    params = sorted({p for t in complete for p in t.params})
    if not complete or not params:
        return None, "Slice plots need at least one complete trial with sampled parameters."
    from optuna.visualization import plot_slice

    fig = plot_slice(data.study, **_target(data))
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


MULTI_ONLY = ("pareto-front", "objectives-parallel", "hypervolume")  # drawn for a study of several objectives only


def plots_for(data: ReportData) -> list:
    return [p for p in PLOTS if _multi(data) or p[0] not in MULTI_ONLY]


PLOTS = [
    ("pareto-front", "Pareto front", fig_pareto,
     "Several objectives: every complete trial in objective space; the highlighted ones are the Pareto front (no other "
     "feasible trial is at least as good in every objective and better in one). Infeasible trials are never on it."),
    ("objectives-parallel", "Objectives, parallel coordinates", fig_objectives,
     "Several objectives, any number of them: one vertical axis per objective (max/min: its direction), one line per "
     "complete trial. Blue lines are the feasible Pareto front (green: its knee, the single best), grey ones feasible "
     "but dominated, red ones violate a constraint. Drag along an axis to keep only the trials in a range."),
    ("hypervolume", "Hypervolume", fig_hypervolume,
     "How much of objective space the front dominates, after each complete trial (reference: each objective's worst "
     "value, pushed 10% out). A flattening curve means the front stopped moving."),
    ("optimization-history", "Optimization history", fig_history,
     "Each dot is one complete trial's {metric} in the order the trials ran; the line is the best value so far. "
     "A line that is still climbing (or falling, for a minimized metric) means more trials would likely help. The shaded "
     "band, once a noise floor is measured, holds the values within that noise of the best: gains inside it are seed luck."),
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
