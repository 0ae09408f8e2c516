"""The promotion gate on fabricated test metrics: no training, no stores, no MLflow."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpolab.errors import EXIT_OK, EXIT_REFUSED
from hpolab.registry.gate import ALREADY_CHAMPION, PROMOTE, REFUSE, Contest, already_champion, decide, gate_metric

CHAMP = {"acc": 0.95, "loss": 0.20, "macro_f1": 0.94, "n": 360}
CONTEST = Contest(model="digits-cnn", alias="champion", trial=3, study="digits-cnn", champion_version="1")


def metrics(**changes: float) -> dict[str, float]:
    return {**CHAMP, **changes}


def test_a_better_challenger_is_promoted():
    d = decide(metrics(acc=0.97), CHAMP, "acc", False, CONTEST)
    assert d.outcome == PROMOTE and d.promote and d.exit_code == EXIT_OK
    assert d.reason == "the challenger beats champion version 1: test_acc 0.9700 vs 0.9500 (maximize)"


def test_a_worse_challenger_is_refused_with_exit_3():
    d = decide(metrics(acc=0.90, loss=0.01), CHAMP, "acc", False, CONTEST)  # a better loss does not help
    assert d.outcome == REFUSE and not d.promote and d.exit_code == EXIT_REFUSED
    assert d.reason == (
        "REFUSED: the challenger (trial 3 of digits-cnn) is not better than digits-cnn@champion (version 1): "
        "test_acc 0.9000 vs 0.9500 (maximize). Nothing changed; --force moves the alias anyway."
    )


def test_a_loss_gate_minimizes():
    assert decide(metrics(loss=0.10), CHAMP, "loss", False, CONTEST).promote
    assert decide(metrics(loss=0.30, acc=1.0), CHAMP, "loss", False, CONTEST).outcome == REFUSE


def test_an_exact_tie_is_broken_by_the_tie_break_metric():
    won = decide(metrics(loss=0.15), CHAMP, "acc", False, CONTEST)  # same accuracy, lower loss
    assert won.promote
    assert "test_acc 0.9500 vs 0.9500 (maximize), tied: test_loss 0.1500 vs 0.2000 (minimize)" in won.reason
    lost = decide(metrics(loss=0.25), CHAMP, "acc", False, CONTEST)
    assert lost.outcome == REFUSE and "tied: test_loss 0.2500 vs 0.2000" in lost.reason
    # a loss gate ties on loss and is broken by accuracy
    assert decide(metrics(acc=0.96), CHAMP, "loss", False, CONTEST).promote
    assert decide(metrics(acc=0.94), CHAMP, "loss", False, CONTEST).outcome == REFUSE


def test_equal_on_both_metrics_is_not_better():
    assert decide(dict(CHAMP), CHAMP, "acc", False, CONTEST).outcome == REFUSE


def test_no_champion_the_challenger_takes_the_alias():
    d = decide(metrics(acc=0.10), None, "acc", False, Contest("digits-cnn", "champion", 3, "digits-cnn"))
    assert d.promote and d.exit_code == EXIT_OK
    assert d.reason == "digits-cnn@champion does not exist yet: the challenger takes it"


def test_force_moves_the_alias_to_a_worse_challenger():
    d = decide(metrics(acc=0.90), CHAMP, "acc", True, CONTEST)
    assert d.promote and d.exit_code == EXIT_OK
    assert d.reason == "the challenger is NOT better than version 1 (test_acc 0.9000 vs 0.9500 (maximize)); --force: moving the alias anyway"


def test_a_champion_that_cannot_be_compared_is_refused_unless_forced():
    contest = Contest("digits-cnn", "champion", 3, "digits-cnn", champion_version="2", not_comparable="its test split differs")
    refused = decide(metrics(), None, "acc", False, contest)
    assert refused.outcome == REFUSE and refused.exit_code == EXIT_REFUSED
    assert refused.reason == ("REFUSED: the current champion (version 2) cannot be compared: its test split differs. "
                              "Nothing changed; --force moves the alias anyway.")
    forced = decide(metrics(), None, "acc", True, contest)
    assert forced.promote
    assert forced.reason == "the current champion (version 2) cannot be compared: its test split differs; --force: moving the alias anyway"


@pytest.mark.parametrize("gate", ["acc", "loss", "macro_f1"])
def test_nan_is_never_better(gate):
    nan = math.nan
    assert decide(metrics(**{gate: nan}), CHAMP, gate, False, CONTEST).outcome == REFUSE  # a NaN challenger
    assert decide(metrics(), metrics(**{gate: nan}), gate, False, CONTEST).outcome == REFUSE  # against a NaN champion
    # a tie on the gate metric with a NaN tie-break metric is not better either
    tie = {"acc": "loss", "loss": "acc", "macro_f1": "loss"}[gate]
    assert decide(metrics(**{tie: nan}), CHAMP, gate, False, CONTEST).outcome == REFUSE
    forced = decide(metrics(**{gate: nan}), CHAMP, gate, True, CONTEST)
    assert forced.promote and f"test_{gate} nan vs" in forced.reason


def test_already_champion_is_nothing_to_do():
    contest = Contest("digits-cnn", "champion", 3, "digits-cnn", champion_version="1", challenger_version="1")
    d = decide(metrics(acc=0.10), CHAMP, "acc", False, contest)
    assert d.outcome == ALREADY_CHAMPION and not d.promote and d.exit_code == EXIT_OK
    assert d.reason == "digits-cnn@champion is already version 1 (trial 3 of digits-cnn): nothing to do"
    assert already_champion(contest) == d
    # a version of its own that does not hold the alias is not "already champion"
    assert already_champion(Contest("digits-cnn", "champion", 3, "digits-cnn", champion_version="2", challenger_version="1")) is None
    assert already_champion(Contest("digits-cnn", "champion", 3, "digits-cnn")) is None


def test_the_gate_metric_follows_the_selection_metric():
    assert gate_metric(("val_acc", "val_acc"), CHAMP) == "acc"
    assert gate_metric(("val_loss", "val_acc"), CHAMP) == "loss"
    assert gate_metric(("val_macro_f1", "val_loss"), CHAMP) == "macro_f1"
    assert gate_metric(("val_top5", "val_loss"), CHAMP) == "loss"  # no test counterpart: the study's metric
    assert gate_metric(("val_top5", "val_top5"), CHAMP) is None


# ---------------------------------------------------------------- one gate for the routine and an own loop

# The same study (val_rmse, minimized) as each kind of experiment gives it to the gate: the routine's task
# evaluation (split-agnostic names, the task's metric directions) and an own loop's evaluate(model, "test")
# (its own names, its METRIC_DIRECTIONS).
KINDS = {
    "routine": ({"loss": 0.30, "rmse": 50.0, "mae": 40.0, "r2": 0.40, "n": 89},
                {"val_loss": "minimize", "val_rmse": "minimize", "val_mae": "minimize", "val_r2": "maximize"}),
    "own loop": ({"test_r2": 0.40, "test_rmse": 50.0, "test_loss": 0.30, "epochs": 7},
                 {"val_rmse": "minimize", "val_r2": "maximize"}),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_gate_reads_either_kind_of_experiment_the_same_way(kind):
    from hpolab.registry.gate import directions

    test, declared = KINDS[kind]
    gate = gate_metric(("val_rmse",), test)
    assert gate == {"routine": "rmse", "own loop": "test_rmse"}[kind]
    d = directions(test, gate, declared, "minimize")
    loss = {"routine": "loss", "own loop": "test_loss"}[kind]
    r2 = {"routine": "r2", "own loop": "test_r2"}[kind]
    assert list(d)[:2] == [gate, loss] and d[gate] == "minimize" and d[r2] == "maximize"
    assert not {"n", "epochs"} & set(d)  # a count has no direction: shown, never decides

    def vs(**changes):
        return decide({**test, **changes}, test, gate, False, CONTEST, d)

    assert vs(**{gate: 49.0}).promote and vs(**{gate: 51.0, r2: 0.9}).outcome == REFUSE
    assert vs(**{loss: 0.20}).promote and "tied:" in vs(**{loss: 0.20}).reason  # a tie goes to the lower loss
    assert vs(**{loss: 0.40}).outcome == REFUSE
    with_study_direction = directions(test, gate, {}, "minimize")  # (nothing declared: the study's direction)
    assert with_study_direction[gate] == "minimize" and list(with_study_direction)[1] == loss


# ---------------------------------------------------------------- what an evaluate() may return


def test_the_gate_metric_is_the_test_counterpart_evaluate_returns():
    from hpolab.registry.gate import candidates, gate_metric

    assert candidates("val_acc") == ["test_acc", "acc", "val_acc"]
    assert gate_metric("val_acc", {"loss": 0.3, "acc": 0.9}) == "acc"  # split-agnostic names
    assert gate_metric("val_acc", {"acc": 0.9, "test_acc": 0.8}) == "test_acc"  # an explicit test_ name first
    assert gate_metric("accuracy", {"accuracy": 0.9}) == "accuracy"
    assert gate_metric("val_acc", {"val_loss": 0.3}) is None


def test_an_evaluate_result_without_the_gate_metric_is_one_clear_line():
    from hpolab.errors import UserError
    from hpolab.registry.gate import checked_metrics

    with pytest.raises(UserError, match=r"returned loss; the gate needs 'test_acc' or 'acc' or 'val_acc'"):
        checked_metrics({"loss": 0.3}, "x", "val_acc")
    with pytest.raises(UserError, match="must return a dict"):
        checked_metrics(0.9, "x", "val_acc")
    with pytest.raises(UserError, match="'acc': 'high', not a number"):
        checked_metrics({"acc": "high"}, "x", "val_acc")
    assert checked_metrics({"acc": np.float32(0.5)}, "x", "val_acc") == {"acc": 0.5}


def test_the_gate_decides_on_the_returned_metric_in_the_study_direction_and_breaks_ties_on_the_loss():
    from hpolab.registry import gate
    from hpolab.registry.gate import directions

    d = directions({"acc": 0.9, "loss": 0.3, "f1": 0.8}, "acc", {"val_acc": "maximize", "val_loss": "minimize"}, "maximize")
    assert list(d) == ["acc", "loss"]  # f1: no declared direction, never decides
    contest = gate.Contest("m", "champion", 3, "s", champion_version="1")
    better = gate.decide({"acc": 0.91, "loss": 0.5}, {"acc": 0.90, "loss": 0.1}, "acc", False, contest, d, prefix="test ")
    assert better.promote and "test acc 0.9100 vs 0.9000 (maximize)" in better.reason
    tie = gate.decide({"acc": 0.9, "loss": 0.5}, {"acc": 0.9, "loss": 0.1}, "acc", False, contest, d, prefix="test ")
    assert not tie.promote and tie.exit_code == 3 and "tied: test loss" in tie.reason
    # a minimized study metric: lower wins
    lo = directions({"test_loss": 0.2}, "test_loss", None, "minimize")
    assert gate.decide({"test_loss": 0.2}, {"test_loss": 0.3}, "test_loss", False, contest, lo, prefix="").promote


