"""The gate's rules for an own-loop experiment (`train(config, trial)`): pure functions, no stores.

The experiment's `evaluate(model, split) -> dict[str, float]` scores a model on its own held-out split;
promote calls it with split "test" for the challenger and for the alias holder. The gate compares:

- the study metric's test counterpart as evaluate returns it: for `val_<x>` the first of `test_<x>`,
  `<x>` (an evaluate whose names do not depend on the split: {"acc": ..., "loss": ...}) and `val_<x>`;
  for a metric without the `val_` prefix, `test_<name>`, then the name itself;
- in the study metric's direction (the spec's, checked against METRIC_DIRECTIONS at load time);
- an exact tie is decided by a second returned metric whose direction is known (a loss first).

Direction of another returned name: the experiment's METRIC_DIRECTIONS of its `val_` counterpart (or of
the name itself); else a name containing "loss" is minimized. Names whose direction is unknown are
shown but never decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpolab.errors import UserError


def candidates(study_metric: str) -> list[str]:
    """The names evaluate(model, "test") may return for the study metric, in the order they are looked for."""
    if study_metric.startswith("val_"):
        x = study_metric[len("val_"):]
        return [f"test_{x}", x, study_metric]
    return [f"test_{study_metric}", study_metric]


def gate_metric(study_metric: str, returned) -> str | None:
    """The returned name that gates (module docstring), or None when none of the candidates is there."""
    return next((n for n in candidates(study_metric) if n in returned), None)


def checked_metrics(returned: Any, experiment: str, study_metric: str) -> dict[str, float]:
    """evaluate's return value as {name: float}, with a gate metric in it; UserError naming what is wrong."""
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


def directions(test: Mapping[str, float], gate: str, gate_direction: str,
               declared: Mapping[str, str] | None) -> dict[str, str]:
    """{name: maximize | minimize} of the returned metrics whose direction is known, the gate first,
    then losses (the tie-break, gate.tie_break, takes the first other name)."""
    declared = dict(declared or {})
    out = {gate: gate_direction}
    rest: dict[str, str] = {}
    for name in test:
        if name == gate:
            continue
        x = name.removeprefix("test_")
        d = declared.get(f"val_{x}") or declared.get(name) or ("minimize" if "loss" in name else None)
        if d in ("maximize", "minimize"):
            rest[name] = d
    out.update(sorted(rest.items(), key=lambda kv: "loss" not in kv[0]))  # a loss breaks ties first
    return out
