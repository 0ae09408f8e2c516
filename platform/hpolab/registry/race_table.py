"""A promotion race as the table promote prints: candidate, params, seeds, mean ± 95% CI, P(best),
and when it was dropped (or why it failed)."""

from __future__ import annotations

import math

import numpy as np
from rich.console import Console
from rich.table import Table

from hpolab.registry.race_stats import ci95

PARAMS_SHOWN = 4  # params per candidate in the table (all of them are in race.json)


def _num(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"


def mean_ci(values: list[float]) -> str:
    """'0.9861 ± 0.0042' (half the 95% interval); the mean alone from one value."""
    if not values:
        return "-"
    mean = float(np.mean(values))
    low, high = ci95(values)
    return _num(mean) if math.isnan(low) else f"{_num(mean)} ± {(high - low) / 2:.4f}"


def _params(params: dict) -> str:
    shown = [f"{k.split('.')[-1]}={v:.3g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}" for k, v in params.items()]
    return ", ".join(shown[:PARAMS_SHOWN]) + (" ..." if len(shown) > PARAMS_SHOWN else "")


def race_table(result) -> Table:
    names = list(result.objectives[next(iter(result.objectives))]) if result.objectives else [result.metric]
    t = Table(title=f"race on {result.metric} ({result.direction}) over seeds {', '.join(map(str, result.seeds))}: "
                    f"winner {result.winner}", title_justify="left")
    for col in ("candidate", "params", "study value", "seeds", *[f"{n} mean ± CI" for n in names], "P(best)", "dropped"):
        t.add_column(col, justify="left" if col in ("candidate", "params", "dropped") else "right")
    for c in result.plan.candidates:
        s = result.standings[c.label]
        per = result.objectives.get(c.label) or {result.metric: s.values}
        cells = [mean_ci([per[n][k] for k in sorted(per.get(n, {}))]) for n in names]
        dropped = (f"after round {s.dropped_after} (p={s.p_value:.3f})" if s.dropped_after else
                   f"failed: {s.failed}" if s.failed else "")
        mark = " (winner)" if c.label == result.winner else ""
        t.add_row(c.shown + mark, _params(c.params), _num(c.value), str(len(s.values)), *cells, f"{s.p_best:.2f}", dropped)
    return t


def print_race(result) -> None:
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=200)
    console.print(race_table(result))
    noise = f"noise floor (sd of {result.metric} over seeds, pooled): {result.noise:.4f}" if result.noise is not None else ""
    console.print(f"race: {result.rounds} round{'s' * (result.rounds != 1)}, {result.epochs} epochs trained"
                  + (f"; {noise}" if noise else "") + f"; its runs: MLflow run {result.run_id} (race)")
    if result.why:
        console.print(f"race: chosen by {result.why}")
