"""The promotion gate as pure functions: test metrics in, a decision with its reason out, the same for
every experiment (the routine's task evaluation and an own loop's `evaluate(model, "test")` alike).

No stores, no MLflow, no models: `decide` sees the challenger's and the alias holder's metrics on the
same held-out test split (dicts such as {"acc": 0.97, "loss": 0.11, "macro_f1": 0.96}) and the
names and versions it needs for the message. Which returned metric gates (`gate_metric`): the study
metric's test counterpart, for `val_<x>` the first of `test_<x>`, `<x>` (names that do not depend on
the split, as the routine's evaluation returns them) and `val_<x>`; for a metric without the `val_`
prefix `test_<name>`, then the name itself. Directions (`directions`): what the experiment declares
for the `val_` counterpart (its task's metric directions, or an own loop's METRIC_DIRECTIONS), else a
name holding "loss" is minimized; names of unknown direction are shown but never decide. The
challenger must be strictly better on the gate metric; an exact tie is decided by a second test
metric (`tie_break`: a loss first). `--force` turns a refusal into a promotion, with the reason saying so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpolab.errors import EXIT_OK, EXIT_REFUSED, UserError

# Classification's test metrics and directions: decide's default (the tests' fabricated metrics).
TEST_DIRECTION = {"acc": "maximize", "loss": "minimize", "macro_f1": "maximize"}

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


def candidates(metric: str) -> list[str]:
    """The names a test evaluation may give the metric's counterpart, in the order they are looked for."""
    if metric.startswith("val_"):
        x = metric[len("val_"):]
        return [f"test_{x}", x, metric]
    return [f"test_{metric}", metric]


def gate_metric(metrics: str | Sequence[str], test: Iterable[str]) -> str | None:
    """The test metric that gates: the first counterpart among `test`'s names of the first of `metrics`
    (the selection metric, then the study's) that has one; None when none has."""
    names = set(test)
    for metric in [metrics] if isinstance(metrics, str) else metrics:
        found = next((n for n in candidates(metric) if n in names), None)
        if found is not None:
            return found
    return None


def checked_metrics(returned: Any, experiment: str, study_metric: str) -> dict[str, float]:
    """An experiment's evaluate(model, "test") result as {name: float}, with a gate metric in it;
    UserError naming what is wrong."""
    where = f"experiment {experiment}: evaluate(model, \"test\")"
    want = " or ".join(repr(n) for n in candidates(study_metric))
    if not isinstance(returned, Mapping) or not returned:
        raise UserError(f"{where} returned {type(returned).__name__}; it must return a dict of metric name -> float, "
                        f"with {want} in it")
    out: dict[str, float] = {}
    for k, v in returned.items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            raise UserError(f"{where} returned {k!r}: {v!r}, not a number") from None
    if gate_metric(study_metric, out) is None:
        raise UserError(f"{where} returned {', '.join(sorted(out))}; the gate needs {want} "
                        f"(the test counterpart of the study metric {study_metric})")
    return out


def directions(test: Iterable[str], gate: str, declared: Mapping[str, str] | None, study_direction: str) -> dict[str, str]:
    """{name: maximize | minimize} of the test metrics whose direction is known, the gate first (its
    declared direction, else the study's), then losses (the tie-break takes the first other name).
    `declared`: directions by `val_` name (a task's metric_directions, an own loop's METRIC_DIRECTIONS)."""
    declared = dict(declared or {})

    def known(name: str) -> str | None:
        x = name.removeprefix("test_")
        d = declared.get(f"val_{x}") or declared.get(name) or ("minimize" if "loss" in name else None)
        return d if d in ("maximize", "minimize") else None

    out = {gate: known(gate) or study_direction}
    rest = {name: d for name in test if name != gate and (d := known(name)) is not None}
    out.update(sorted(rest.items(), key=lambda kv: "loss" not in kv[0]))  # a loss breaks ties first
    return out


def tie_break(gate: str, directions: Mapping[str, str]) -> str:
    """The second test metric that decides an exact tie on `gate`: a loss, else the first other metric."""
    others = [m for m in directions if m != gate]
    return next((m for m in others if "loss" in m), others[0] if others else gate)


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
