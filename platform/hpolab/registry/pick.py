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


def pick_from_front(study, names: list[str], rule_text: str | None):
    """(trial, why) -- UserError naming the front when nothing on it meets the rule."""
    directions = ranking.directions_of(study)
    on_front = ranking.front(study.get_trials(deepcopy=False), directions)
    if not on_front:
        raise UserError(f"study {study.study_name!r} has no feasible COMPLETE trial to promote; run it (or relax its constraints)")
    values = {t.number: values_of(t, names) for t in on_front}
    known = sorted({k for v in values.values() for k in v})
    rule = parse_rule(rule_text or "", known)
    meets = [t for t in on_front if all(m in values[t.number] and OPS[op](values[t.number][m], v) for m, op, v in rule.bounds)]
    if not meets:
        shown = "; ".join(f"trial {t.number}: " + ", ".join(f"{k}={v:.4g}" for k, v in values[t.number].items()) for t in on_front)
        raise UserError(f"--pick {rule.describe()!r}: no trial on the Pareto front meets it. The front: {shown}")
    if rule.choose:
        how, metric = rule.choose
        chosen = (min if how == "min" else max)(meets, key=lambda t: (values[t.number][metric], t.number))
    else:
        chosen = ranking.knee(meets, directions)
    why = (f"--pick {rule.describe()}" if rule_text else "the knee of the Pareto front (no --pick)") + \
        f": trial {chosen.number} of {len(on_front)} on the front ({', '.join(str(t.number) for t in on_front)}), " + \
        ", ".join(f"{k}={v:.4g}" for k, v in values[chosen.number].items())
    return chosen, why
