"""The promotion gate on fabricated test metrics: no training, no stores, no MLflow."""

from __future__ import annotations

import math

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
    assert gate_metric("val_acc", "val_acc") == "acc"
    assert gate_metric("val_loss", "val_acc") == "loss"
    assert gate_metric("val_macro_f1", "val_loss") == "macro_f1"
    assert gate_metric("val_top5", "val_loss") == "loss"  # no test counterpart: the study's metric
    assert gate_metric("val_top5", "val_top5") == "acc"
