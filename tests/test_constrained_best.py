"""A study of one objective with constraints: an infeasible trial (a constraint violated) is never
the best -- not for stop_after_no_improvement, not on the progress line, not in `study list` or
`study status`. ranking.py decides; logic on fabricated trials, then the real CLI."""

from __future__ import annotations

import io

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console

from conftest import FAULT_PROJECT, run_cli
from hpolab.config.spec import load_spec
from hpolab.study.driver.progress import Progress
from hpolab.study.objectives.stopping import no_improvement_streak, one_objective_results

# val_a minimized, val_c <= 0 (tests/fault_project/experiments/fixed_point.py): trial 0 is the lowest
# val_a but infeasible; 1, 2 and 3 are feasible and each better than the one before.
POINTS = "model.points={x: [0.0, 0.0, 1.0], f: [6.0, 0.0, 0.0], g: [5.0, 0.0, 0.0], h: [4.0, 0.0, 0.0]}"
ONE = ["studies/fixed_point.yaml", "name=one-constrained", "objectives=[{metric: val_a, direction: minimize}]", POINTS,
       "enqueue=[{model.point: x}, {model.point: f}, {model.point: g}, {model.point: h}]",
       "search_space={model.point: {type: categorical, choices: [x, f, g, h]}}", "log_models=none"]


def _trial(number, value, constraints):
    t = create_trial(state=TrialState.COMPLETE, value=value, params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
                     system_attrs={"constraints": constraints})
    t.number = number
    return t


TRIALS = [_trial(0, 0.0, [1.0]), _trial(1, 6.0, [0.0]), _trial(2, 5.0, [0.0]), _trial(3, 4.0, [0.0])]


def test_an_infeasible_result_is_a_miss_for_stopping():
    values = one_objective_results(TRIALS)
    assert values == [None, 6.0, 5.0, 4.0]
    assert no_improvement_streak(values, False, 0.0) == (0, 3)  # each feasible trial improved


def test_the_progress_line_never_calls_an_infeasible_trial_best():
    spec = load_spec(str(FAULT_PROJECT / "studies/fixed_point.yaml"), ["objectives=[{metric: val_a, direction: minimize}]"])
    out = io.StringIO()
    p = Progress(spec, console=Console(file=out, width=200, highlight=False))
    for i, t in enumerate(TRIALS):
        counts = {"finished": i + 1, "complete": i + 1, "pruned": 0, "fail": 0}
        p.trial_finished(t.number, "COMPLETE", t.value, None, counts, {0: t.value}, trial=t)
    lines = out.getvalue().splitlines()
    assert "trial 0 COMPLETE val_a best=0 (last 0) (infeasible)" in lines[0]
    assert "best -" in lines[1] and "best 6" in lines[3] and "best 4" in lines[7]


@pytest.mark.slow
def test_an_infeasible_trial_is_not_the_best_of_a_study_through_the_cli(store):
    out = run_cli("--store", str(store), "study", "run", *ONE, "stop_after_no_improvement={trials: 2}", cwd=FAULT_PROJECT)
    assert "stop_after_no_improvement" not in out.stdout, out.stdout  # trials 1, 2, 3 each improved: all 4 ran
    study = optuna.load_study(study_name="one-constrained", storage=f"sqlite:///{store / 'optuna.db'}")
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 4
    assert "4/4 finished: 4 complete, 0 pruned, 0 failed | best 4" in out.stdout
    listed = run_cli("--store", str(store), "study", "list").stdout
    row = next(line for line in listed.splitlines() if "one-constrained" in line)
    assert row.split("│")[9].strip() == "4", listed  # the best column: trial 3's 4, not trial 0's 0
    status = run_cli("--store", str(store), "study", "status", "one-constrained").stdout
    assert "best: trial 3 value 4" in status


def test_study_list_and_status_skip_an_infeasible_best(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name="bounded", direction="maximize")
    for t in (_trial(0, 0.99, [2.0]), _trial(1, 0.8, [0.0]), _trial(2, 0.7, [-1.0])):
        study.add_trial(t)
    listed = run_cli("--store", str(store), "study", "list", cwd=tmp_path).stdout
    row = next(line for line in listed.splitlines() if line.startswith("│ bounded "))
    assert row.split("│")[9].strip() == "0.8", listed
    assert "best: trial 1 value 0.8" in run_cli("--store", str(store), "study", "status", "bounded", cwd=tmp_path).stdout
