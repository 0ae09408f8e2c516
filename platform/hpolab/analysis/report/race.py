"""The report's promotion race and noise floor: the study's latest finished race (as promote records it
on the Optuna study: registry/race_record.py; race.json on its race run has the same and every seed's run) as a plot of every candidate's value on each seed with its
mean and 95% interval, and its table; and the band the noise floor draws on the optimisation history.
"""

from __future__ import annotations

import math
from typing import Any

from hpolab.analysis.report import html as H
from hpolab.study.objectives.noise import RACE_ATTR


CAPTION = ("The study's latest promotion race (<code>hpolab promote</code>): its leading configurations trained again "
           "on the same fresh seeds, scored on the validation split. Each dot is one seed's {metric}; the diamond and bar "
           "are the mean and its 95% interval; P(best) is how often a bootstrap over the seeds makes it the best. A "
           "candidate whose paired difference to the leader was significant was dropped after that round.")


def read_race(study) -> dict[str, Any] | None:
    """The latest finished race of the study, as promote recorded it on the Optuna study (RACE_ATTR)."""
    race = study.user_attrs.get(RACE_ATTR)
    return race if isinstance(race, dict) and race.get("candidates") else None


def fig_race(race: dict[str, Any]):
    import plotly.graph_objects as go

    fig = go.Figure()
    for c in race["candidates"]:
        values = list(c["values"].values())
        if not values:
            continue
        faded = c["dropped_after"] is not None or c["failed"]
        label = c["label"] + (" (winner)" if c["label"] == race["winner"] else "")
        fig.add_trace(go.Box(y=values, name=label, boxpoints="all", jitter=0.3, pointpos=0, fillcolor="rgba(0,0,0,0)",
                             line={"color": "#a0aec0" if faded else "#2b6cb0"}, hovertext=[f"seed {s}" for s in c["values"]],
                             showlegend=False))
        mean, (low, high) = c["mean"], c["ci95"]
        if mean is not None and low is not None:
            fig.add_trace(go.Scatter(x=[label], y=[mean], mode="markers", marker={"symbol": "diamond", "size": 11, "color": "#1a202c"},
                                     error_y={"type": "data", "symmetric": False, "array": [high - mean], "arrayminus": [mean - low]},
                                     name=f"{c['label']}: mean ± 95% CI", showlegend=False))
    fig.update_layout(yaxis_title=race["metric"], xaxis_title="candidate (one dot per seed)")
    return fig


def race_section(data) -> str:
    """The section's content: the plot and the table, or a note when the study has no finished race."""
    race = getattr(data, "race", None)
    if not race:
        return H.note("No promotion race yet: <code>hpolab promote</code> races the top trials on fresh seeds before the gate.")
    rows = []
    for c in race["candidates"]:
        low, high = c["ci95"]
        ci = "–" if low is None or c["mean"] is None else f"{c['mean']:.4g} ± {(high - low) / 2:.2g}"
        dropped = f"after round {c['dropped_after']} (p={c['p_value']:.3f})" if c["dropped_after"] else (c["failed"] or "")
        params = ", ".join(f"{k.split('.')[-1]}={H.fmt_num(v, 3)}" for k, v in (c["params"] or {}).items())
        rows.append([c["label"] + (" (winner)" if c["label"] == race["winner"] else ""), params, len(c["values"]), ci,
                     f"{c['p_best']:.2f}", dropped])
    floor = race.get("noise_floor")
    summary = (f"Seeds {', '.join(map(str, race['seeds']))}; {race['rounds']} round(s), {race['epochs']} epochs trained"
               + (f"; noise floor (pooled sd over seeds) {floor:.3g}" if floor is not None else "")
               + f"; MLflow run <span class=mono>{H.esc(race['run_id'])}</span>.")
    table = H.table(["candidate", "params", "seeds", f"{race['metric']} mean ± CI", "P(best)", "dropped"], rows,
                    [False, False, True, False, False, False])
    return H.figure(fig_race(race), "race") + H.note(summary) + table


def add_noise_band(fig, data) -> None:
    """The noise floor, when measured: a band under the best-so-far line (over it, for a minimised
    metric) holding the values within the noise of the best."""
    from optuna.trial import TrialState

    from hpolab.study.objectives import ranking
    from hpolab.study.objectives.noise import noise_floor

    floor = noise_floor(data.study.user_attrs)
    if floor is None or len(data.study.directions) > 1:
        return
    done = ranking.ranked([t for t in data.study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE], [data.direction])
    done = sorted((t for t in done if ranking.feasible(t)), key=lambda t: t.number)
    xs, low, high, best = [], [], [], None
    for t in done:
        best = ranking.best_value([v for v in (best, t.value) if v is not None], data.direction)
        lo, hi = ranking.noise_band(best, floor, data.direction)
        xs.append(t.number), low.append(lo), high.append(hi)
    if not xs or any(math.isnan(v) for v in low):
        return
    import plotly.graph_objects as go

    fig.add_trace(go.Scatter(x=xs, y=high, mode="lines", line={"width": 0, "shape": "hv"}, showlegend=False, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=xs, y=low, mode="lines", line={"width": 0, "shape": "hv"}, fill="tonexty",
                             fillcolor="rgba(221,138,26,0.18)", name=f"within the noise floor ({floor:.3g}) of the best"))
