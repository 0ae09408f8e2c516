"""The table of a study with several objectives: its COMPLETE trials best-first (ranking.py), each
objective's value (a PRUNED trial's as measured), whether it is on the front, feasibility -- what the driver prints at the end and `study status` shows."""

from __future__ import annotations

from rich.table import Table

from hpolab.study.objectives import ranking
from hpolab.study.objectives.objective_values import VALUES_ATTR


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def front_table(study, name: str, title_extra: str = "", limit: int | None = None) -> Table:
    names = study.metric_names or [f"objective {i}" for i in range(len(study.directions))]
    directions = ranking.directions_of(study)
    trials = study.get_trials(deepcopy=False)
    ranked = ranking.ranked(trials, directions)
    marks = ranking.front_marks(trials, directions)
    table = Table(title=f"study {name} ({', '.join(f'{n} {d}' for n, d in zip(names, directions))})"
                  + (f": {title_extra}" if title_extra else ""))
    bounded = sorted({m for t in trials for m in (t.user_attrs.get(VALUES_ATTR) or {})} - set(names))  # constraints' own metrics
    for col in ("trial", "state", *names, *bounded, "front", "feasible"):
        table.add_column(col, justify="left" if col in ("state", "front", "feasible") else "right")
    shown = ranked + [t for t in trials if t.state.name in ("PRUNED", "FAIL", "RUNNING")]
    for t in shown[:limit] if limit else shown:
        recorded = t.user_attrs.get(VALUES_ATTR) or {}
        values = list(t.values) if t.values is not None and len(t.values) == len(names) else [recorded.get(n) for n in names]
        feasible = "" if not t.constraints else ("yes" if ranking.feasible(t) else "no")
        table.add_row(str(t.number), t.state.name, *[_fmt(v) for v in values], *[_fmt(recorded.get(m)) for m in bounded],
                      marks.get(t.number, ""), feasible)
    return table
