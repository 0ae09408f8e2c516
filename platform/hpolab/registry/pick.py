"""Which trial of a several-objective study to promote: a rule the user states, else the knee.

    hpolab promote NAME --pick "val_acc>=0.97; min latency_ms"

A rule is `;`-separated clauses over the study's objectives and recorded metrics (each trial's
`hpolab.objectives` attr: objectives and constrained metrics): bounds `METRIC>=X`, `<=`, `>`, `<`,
and at most one `min METRIC` or `max METRIC` that chooses among the trials meeting the bounds. Only
the feasible Pareto front is considered (ranking.py); without `min`/`max` the knee of the trials
left is taken, without `--pick` the front's knee. Why the trial won is recorded on the model version.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

from hpolab.errors import UserError
from hpolab.study.objectives import ranking
from hpolab.study.objectives.objective_values import VALUES_ATTR

BOUND = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(>=|<=|>|<)\s*([-+0-9.eE]+)\s*$")
CHOOSE = re.compile(r"^\s*(min|max)\s+([A-Za-z_][\w.]*)\s*$")
OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


@dataclass(frozen=True)
class Rule:
    bounds: tuple[tuple[str, str, float], ...] = ()
    choose: tuple[str, str] | None = None  # ("min"|"max", metric)

    def describe(self) -> str:
        parts = [f"{m}{op}{v:g}" for m, op, v in self.bounds] + ([f"{self.choose[0]} {self.choose[1]}"] if self.choose else [])
        return "; ".join(parts) or "knee of the Pareto front"


def parse_rule(text: str, known: list[str]) -> Rule:
    bounds, choose = [], None
    for clause in filter(None, (c.strip() for c in text.split(";"))):
        b, c = BOUND.match(clause), CHOOSE.match(clause)
        metric = b.group(1) if b else c.group(2) if c else None
        if metric is None:
            raise UserError(f"--pick: cannot read {clause!r}; write bounds like val_acc>=0.97 and at most one 'min METRIC' or 'max METRIC', separated by ';'")
        if metric not in known:
            raise UserError(f"--pick: {metric!r} is not an objective or constrained metric of this study; use one of {', '.join(known)}")
        if b:
            try:
                bounds.append((metric, b.group(2), float(b.group(3))))
            except ValueError:
                raise UserError(f"--pick: {b.group(3)!r} in {clause!r} is not a number") from None
        elif choose is not None:
            raise UserError(f"--pick: one 'min'/'max' clause only, got {choose[0]} {choose[1]} and {clause!r}")
        else:
            choose = (c.group(1), metric)
    return Rule(tuple(bounds), choose)


def values_of(t, names: list[str]) -> dict[str, float]:
    """The trial's objectives (in order), then its other recorded metrics (constraints')."""
    recorded = t.user_attrs.get(VALUES_ATTR) or {}
    out = dict(zip(names, t.values)) if t.values is not None and len(t.values) == len(names) else {}
    return {**out, **{k: v for k, v in recorded.items() if k not in out}}


def choose(on_front: list, names: list[str], rule: Rule, directions: list[str]):
    """The trial of `on_front` the rule takes (None: none meets its bounds)."""
    values = {t.number: values_of(t, names) for t in on_front}
    meets = [t for t in on_front if all(m in values[t.number] and OPS[op](values[t.number][m], v) for m, op, v in rule.bounds)]
    if not meets:
        return None
    if rule.choose:
        how, metric = rule.choose
        return (min if how == "min" else max)(meets, key=lambda t: (values[t.number][metric], t.number))
    return ranking.knee(meets, directions)


def rule_for(trials: list, names: list[str], rule_text: str | None) -> Rule:
    """The --pick rule, read against the metrics these trials recorded."""
    return parse_rule(rule_text or "", sorted({k for t in trials for k in values_of(t, names)}))


def picks_in_order(study, trials: list, names: list[str], rule_text: str | None, k: int) -> list:
    """The feasible front's trials in the order the rule takes them, one after another (the first is
    the one promote picks): at most k, fewer when no other meets the rule's bounds."""
    directions = ranking.directions_of(study)
    left = ranking.front(trials, directions)
    rule, out = rule_for(left, names, rule_text), []
    while left and len(out) < k:
        chosen = choose(left, names, rule, directions)
        if chosen is None:
            break
        out.append(chosen)
        left = [t for t in left if t.number != chosen.number]
    return out


def pick_from_front(study, names: list[str], rule_text: str | None):
    """(trial, why) -- UserError naming the front when nothing on it meets the rule."""
    directions = ranking.directions_of(study)
    on_front = ranking.front(study.get_trials(deepcopy=False), directions)
    if not on_front:
        raise UserError(f"study {study.study_name!r} has no feasible COMPLETE trial to promote; run it (or relax its constraints)")
    values = {t.number: values_of(t, names) for t in on_front}
    rule = rule_for(on_front, names, rule_text)
    chosen = choose(on_front, names, rule, directions)
    if chosen is None:
        shown = "; ".join(f"trial {t.number}: " + ", ".join(f"{k}={v:.4g}" for k, v in values[t.number].items()) for t in on_front)
        raise UserError(f"--pick {rule.describe()!r}: no trial on the Pareto front meets it. The front: {shown}")
    why = (f"--pick {rule.describe()}" if rule_text else "the knee of the Pareto front (no --pick)") + \
        f": trial {chosen.number} of {len(on_front)} on the front ({', '.join(str(t.number) for t in on_front)}), " + \
        ", ".join(f"{k}={v:.4g}" for k, v in values[chosen.number].items())
    return chosen, why
