"""Several objectives as the report and `study list` show them: the objectives' parallel coordinates
(any number of objectives) and the list's objectives / front-size cells -- real Optuna studies, in
memory or in a store's SQLite file, no study run (test_pareto_study.py runs one through the CLI)."""

from __future__ import annotations

from collections import Counter

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from conftest import run_cli
from hpolab.analysis.report.data import ReportData
from hpolab.analysis.report.figures import fig_objectives, fig_pareto, plots_for
from hpolab.study.objectives import ranking

pytestmark = pytest.mark.filterwarnings("ignore:.*set_metric_names is experimental")

NAMES = ["val_acc", "latency_ms", "params", "val_f1"]
# trial -> (values, constraint): 0, 1 and 5 are the feasible front; 2 is dominated by 0; 3 dominates
# everything but violates the constraint; 4 is pruned (no values: not drawn).
TRIALS = {
    0: ([0.99, 5.0, 900.0, 0.98], -1.0),
    1: ([0.95, 1.0, 500.0, 0.94], -1.0),
    2: ([0.90, 6.0, 950.0, 0.90], -1.0),
    3: ([1.00, 0.1, 10.0, 1.00], 3.0),
    4: (None, None),
    5: ([0.50, 0.5, 100.0, 0.40], 0.0),
}


def _add(study: optuna.Study) -> None:
    for values, constraint in TRIALS.values():
        state = TrialState.COMPLETE if values else TrialState.PRUNED
        study.add_trial(create_trial(state=state, values=values, params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
                                     system_attrs={"constraints": [constraint]} if constraint is not None else None))


def _four_objectives() -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "minimize", "minimize", "maximize"])
    study.set_metric_names(NAMES)
    _add(study)
    return study


def _data(study: optuna.Study) -> ReportData:
    return ReportData(study, "val_acc", "maximize", Counter(t.state.name for t in study.trials))


def test_the_objectives_parallel_coordinates_colour_front_feasible_and_infeasible_trials():
    study = _four_objectives()
    data = _data(study)
    fig, why = fig_objectives(data)
    assert why is None
    (coords,) = fig.data
    assert coords.type == "parcoords"
    assert [d.label for d in coords.dimensions] == ["val_acc (max)", "latency_ms (min)", "params (min)", "val_f1 (max)"]
    rows = list(zip(*(d.values for d in coords.dimensions)))
    colour = {next(n for n, (v, _) in TRIALS.items() if v and tuple(v) == row): c for row, c in zip(rows, coords.line.color)}
    assert sorted(colour) == [0, 1, 2, 3, 5]  # every complete trial, one line each; the pruned one has no values
    knee = ranking.knee(ranking.front(study.trials, ranking.directions_of(study)), ranking.directions_of(study)).number
    assert colour[3] == 0 and colour[2] == 1  # infeasible; feasible but dominated
    assert {n: c for n, c in colour.items() if c >= 2} == {n: 3 if n == knee else 2 for n in (0, 1, 5)}  # the front, its knee
    assert len({colour[3], colour[2], colour[0 if knee != 0 else 1]}) == 3  # infeasible, dominated, front: three colours
    scale = [c for _, c in coords.line.colorscale]
    assert len({scale[2 * k] for k in range(4)}) == 4 and (coords.line.cmin, coords.line.cmax) == (-0.5, 3.5)
    ticks = list(coords.line.colorbar.ticktext)
    assert ticks[:3] == ["infeasible (1)", "feasible, dominated (1)", "Pareto front (3)"] and ticks[3] == f"knee: trial {knee}"
    assert list(coords.line.color) == sorted(coords.line.color)  # the front drawn last, on top


def test_the_figure_is_listed_after_the_front_for_several_objectives_only():
    data = _data(_four_objectives())
    keys = [k for k, *_ in plots_for(data)]
    assert keys[:3] == ["pareto-front", "objectives-parallel", "hypervolume"]
    fig, why = fig_pareto(data)  # 4 objectives: no scatter, a pointer to the new figure
    assert fig is None and "parallel coordinates below" in why

    one = optuna.create_study(direction="maximize")
    one.add_trial(create_trial(value=0.9, params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)}))
    assert "objectives-parallel" not in [k for k, *_ in plots_for(_data(one))]
    assert fig_objectives(_data(one))[0] is None

    two = optuna.create_study(directions=["maximize", "minimize"])  # no metric names, no trial yet
    assert fig_objectives(_data(two)) == (None, "No complete trial yet.")
    two.add_trial(create_trial(values=[0.9, 2.0], params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)}))
    assert [d.label for d in fig_objectives(_data(two))[0].data[0].dimensions] == ["objective 0 (max)", "objective 1 (min)"]


def test_the_report_page_holds_the_figure():
    from hpolab.analysis.report.command import render
    from hpolab.analysis.report.data import gather

    page = render(gather(_four_objectives()))  # no stores: Optuna's side only
    assert '<section id="objectives-parallel">' in page and '"type":"parcoords"' in page
    assert page.index('id="pareto-front"') < page.index('id="objectives-parallel"') < page.index('id="hypervolume"')


def _cells(stdout: str, name: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if line.startswith(f"│ {name} "))
    return [c.strip() for c in line.strip("│").split("│")]


def test_study_list_shows_the_objectives_and_the_front_size(store):
    url = f"sqlite:///{store / 'optuna.db'}"
    mo = optuna.create_study(study_name="mo", storage=url, directions=["maximize", "minimize", "minimize", "maximize"])
    mo.set_metric_names(NAMES)
    mo.set_user_attr("metric", "val_acc")  # the pruning metric, as spec_guard records it
    _add(mo)
    optuna.create_study(study_name="mo~pruning", storage=url, direction="maximize")  # its companion: never listed
    fresh = optuna.create_study(study_name="mo-fresh", storage=url, directions=["maximize", "minimize"])
    fresh.set_metric_names(NAMES[:2])
    one = optuna.create_study(study_name="one", storage=url, direction="maximize")
    one.set_user_attr("metric", "val_acc")
    for v in (0.91234, 0.95678):
        one.add_trial(create_trial(value=v, params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)}))

    out = run_cli("--store", str(store), "study", "list").stdout
    # study, direction, metric, complete, pruned, fail, running, paused, best, last activity
    assert _cells(out, "mo")[:9] == ["mo", "maximize/minimize/minimize/maximize", "val_acc, latency_ms, params, val_f1",
                                     "5", "1", "0", "0", "0", "front: 3 trials"]
    assert _cells(out, "mo-fresh")[:9] == ["mo-fresh", "maximize/minimize", "val_acc, latency_ms", "0", "0", "0", "0", "0", "-"]
    assert _cells(out, "one")[:9] == ["one", "maximize", "val_acc", "2", "0", "0", "0", "0", "0.9568"]  # as before
    assert "mo~pruning" not in out
