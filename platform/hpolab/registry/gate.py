"""The promotion gate as a pure function: test metrics in, a decision with its reason out.

No stores, no MLflow, no models: `decide` sees the challenger's and the alias holder's metrics on the
same held-out test split (dicts such as {"acc": 0.97, "loss": 0.11, "macro_f1": 0.96}) and the
names and versions it needs for the message. The challenger must be strictly better on the gate
metric; an exact tie is decided by a second test metric (TIE_BREAK). `--force` turns a refusal into
a promotion, with the reason saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpolab.errors import EXIT_OK, EXIT_REFUSED

# Classification's names (the defaults). Other tasks pass their own directions (train/tasks/, val_ prefix
# dropped): val_* metric a study selects on -> the test metric that gates promotion, and its direction
TEST_METRIC_FOR = {"val_acc": "acc", "val_loss": "loss", "val_macro_f1": "macro_f1"}
TEST_DIRECTION = {"acc": "maximize", "loss": "minimize", "macro_f1": "maximize"}
# An exact tie on the gate metric (likely with accuracy on a small test set, e.g. two models at
# 100 %) is decided by a second test metric, so a perfect champion does not freeze the alias forever.
TIE_BREAK = {"acc": "loss", "macro_f1": "loss", "loss": "acc"}

PROMOTE = "promote"
REFUSE = "refuse"
ALREADY_CHAMPION = "already-champion"


@dataclass(frozen=True)
class Contest:
    """Who meets at the gate: names and versions only, for the reason text."""

    model: str  # registered model name
    alias: str
    trial: int  # the challenger's trial number
    study: str
    champion_version: str | None = None  # the alias holder's version; None: nobody holds the alias
    challenger_version: str | None = None  # the challenger's own registered version, when it already has one
    not_comparable: str | None = None  # why there are no champion metrics although there is a champion


@dataclass(frozen=True)
class Decision:
    outcome: str  # PROMOTE, REFUSE or ALREADY_CHAMPION
    reason: str  # one line, printed as it is

    @property
    def promote(self) -> bool:
        return self.outcome == PROMOTE

    @property
    def exit_code(self) -> int:
        return EXIT_REFUSED if self.outcome == REFUSE else EXIT_OK


def gate_metric(selection_metric: str, study_metric: str, test_metrics: Mapping[str, float] | None = None) -> str:
    """The test metric that gates promotion: the one matching the selection metric, else the study's.

    With `test_metrics` (any task: val_rmse -> rmse when "rmse" is among them), else loss; without,
    the classification names (TEST_METRIC_FOR), else acc."""
    if test_metrics is not None:
        for m in (selection_metric, study_metric):
            if m.startswith("val_") and m[len("val_"):] in test_metrics:
                return m[len("val_"):]
        return "loss"
    return TEST_METRIC_FOR.get(selection_metric) or TEST_METRIC_FOR.get(study_metric) or "acc"


def tie_break(gate: str, directions: Mapping[str, str]) -> str:
    """The second test metric that decides an exact tie on `gate` (loss, or for a loss gate the task's first other metric)."""
    if gate in TIE_BREAK and TIE_BREAK[gate] in directions:
        return TIE_BREAK[gate]
    if gate != "loss" and "loss" in directions:
        return "loss"
    return next((m for m in directions if m != gate), gate)


def better(challenger: Mapping[str, float], holder: Mapping[str, float], gate: str,
           directions: Mapping[str, str] = TEST_DIRECTION) -> bool:
    """Strictly better on the gate metric; on an exact tie, strictly better on the tie-break metric.
    NaN on either side is never better (every comparison with NaN is false). `directions`: the task's
    test metrics -> maximize | minimize (classification's by default)."""

    def key(m: Mapping[str, float], name: str) -> float:
        return m[name] if directions[name] == "maximize" else -m[name]

    tie = tie_break(gate, directions)
    return (key(challenger, gate), key(challenger, tie)) > (key(holder, gate), key(holder, tie))


def already_champion(contest: Contest) -> Decision | None:
    """The challenger's own version already holds the alias: nothing to do (decided before any evaluation)."""
    if contest.challenger_version is None or contest.challenger_version != contest.champion_version:
        return None
    return Decision(
        ALREADY_CHAMPION,
        f"{contest.model}@{contest.alias} is already version {contest.champion_version} "
        f"(trial {contest.trial} of {contest.study}): nothing to do",
    )


def decide(
    challenger: Mapping[str, float],
    champion: Mapping[str, float] | None,
    gate: str,
    force: bool,
    contest: Contest,
    directions: Mapping[str, str] = TEST_DIRECTION,
    prefix: str = "test_",
) -> Decision:
    """Promote, refuse or nothing to do; `champion` is None when there is none or it cannot be compared.
    `directions`: the task's test metrics -> maximize | minimize (classification's by default).
    `prefix`: prepended to metric names in the reason ("" where they are named as evaluate() returns them)."""
    already = already_champion(contest)
    if already is not None:
        return already
    c = contest
    if c.champion_version is None:
        return Decision(PROMOTE, f"{c.model}@{c.alias} does not exist yet: the challenger takes it")
    if champion is None:
        verdict = f"the current {c.alias} (version {c.champion_version}) cannot be compared: {c.not_comparable}"
        if not force:
            return Decision(REFUSE, f"REFUSED: {verdict}. Nothing changed; --force moves the alias anyway.")
        return Decision(PROMOTE, verdict + "; --force: moving the alias anyway")
    cmp = f"{prefix}{gate} {challenger[gate]:.4f} vs {champion[gate]:.4f} ({directions[gate]})"
    if challenger[gate] == champion[gate]:
        tie = tie_break(gate, directions)
        cmp += f", tied: {prefix}{tie} {challenger[tie]:.4f} vs {champion[tie]:.4f} ({directions[tie]})"
    if better(challenger, champion, gate, directions):
        return Decision(PROMOTE, f"the challenger beats {c.alias} version {c.champion_version}: {cmp}")
    if not force:
        return Decision(
            REFUSE,
            f"REFUSED: the challenger (trial {c.trial} of {c.study}) is not better than {c.model}@{c.alias} "
            f"(version {c.champion_version}): {cmp}. Nothing changed; --force moves the alias anyway.",
        )
    return Decision(PROMOTE, f"the challenger is NOT better than version {c.champion_version} ({cmp}); --force: moving the alias anyway")
