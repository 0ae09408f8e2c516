"""The report's parallel coordinates (one plotly Parcoords trace, not one Scatter per trial): the
metric and each varying parameter, numbers as they are, log-sampled ones on a log10 axis, choices in
the distribution's order -- a real in-memory Optuna study, no study run."""

from __future__ import annotations

import math
from collections import Counter

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from hpolab.analysis.report.data import ReportData
from hpolab.analysis.report.figures import fig_parallel

DISTS = {"lr": FloatDistribution(1e-4, 1e-1, log=True), "act": CategoricalDistribution(["relu", "gelu", None]),
         "depth": IntDistribution(1, 4), "fixed": FloatDistribution(0, 1)}


def _study(direction: str) -> optuna.Study:
    study = optuna.create_study(direction=direction)
    rows = [(0.9, {"lr": 1e-3, "act": "gelu", "depth": 2}), (0.7, {"lr": 3e-2, "act": None, "depth": 4}),
            (0.8, {"lr": 2e-4, "act": "relu", "depth": 1}), (float("inf"), {"lr": 1e-2, "act": "relu", "depth": 3}),
            (0.6, {"lr": 5e-3, "act": "relu"})]  # (a conditional space: no depth -> not drawn)
    for value, params in rows:
        params = {**params, "fixed": 0.5}  # never varies: no axis
        study.add_trial(create_trial(value=value, params=params, distributions={k: DISTS[k] for k in params}))
    study.add_trial(create_trial(state=TrialState.PRUNED, params={"lr": 1e-1}, distributions={"lr": DISTS["lr"]}, intermediate_values={0: 0.1}))
    return study


def test_one_parcoords_trace_with_an_axis_per_varying_parameter():
    study = _study("maximize")
    fig, why = fig_parallel(ReportData(study, "val_acc", "maximize", Counter(t.state.name for t in study.trials)))
    assert why is None
    (coords,) = fig.data
    assert coords.type == "parcoords"
    axes = {d.label: d for d in coords.dimensions}
    assert list(axes) == ["val_acc", "act", "depth", "lr"]
    assert list(axes["val_acc"].values) == [0.9, 0.7, 0.8]  # complete, finite, every parameter: trials 0-2
    assert list(axes["depth"].values) == [2, 4, 1]
    assert list(axes["act"].ticktext) == ["relu", "gelu", "None"] and list(axes["act"].values) == [1, 2, 0]
    assert list(axes["lr"].values) == [math.log10(1e-3), math.log10(3e-2), math.log10(2e-4)]
    ticks = dict(zip(axes["lr"].ticktext, axes["lr"].tickvals))
    assert set(ticks) == {"3e-4", "1e-3", "3e-3", "1e-2", "3e-2"}  # inside the drawn range only
    assert ticks["1e-3"] == -3 and coords.line.reversescale is False and list(coords.line.color) == [0.9, 0.7, 0.8]


def test_a_minimised_metric_reverses_the_colours_and_too_few_trials_say_why():
    study = _study("minimize")
    fig, _ = fig_parallel(ReportData(study, "val_loss", "minimize", Counter()))
    assert fig.data[0].line.reversescale is True
    one = optuna.create_study()
    one.add_trial(create_trial(value=1.0, params={"lr": 1e-3}, distributions={"lr": DISTS["lr"]}))
    fig, why = fig_parallel(ReportData(one, "val_loss", "minimize", Counter()))
    assert fig is None and "at least 2 complete trials" in why
