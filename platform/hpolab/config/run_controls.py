"""The run controls `hpolab study set NAME key=value ...` may change while a study runs.

They say how much and how fast a study runs, never what a trial means: the same `key=value`
overrides as on the command line (overrides.py), checked by the same StudySpec validation as a spec
(a wrong value names its field), against the study's recorded spec so that rules between fields
hold (PBT: n_trials is the population). A driver applies them to its own spec with `with_controls`,
validated once more.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from hpolab.config.messages import validation_messages
from hpolab.config.overrides import apply_overrides, parse_overrides
from hpolab.config.spec import StudySpec
from hpolab.errors import SpecError

# What `study set` may change, and what each means to a running driver.
RUN_CONTROLS = {
    "n_trials": "the study's total of finished trials",
    "parallel": "trials each driver runs at once",
    "timeout": "each driver's session, counted from its start (seconds, or 30m, 2h)",
    "trial_timeout": "seconds (or 30m, 2h) per trial, then FAIL and a retry",
    "budget.epochs": "epochs trained over all trials",
    "max_failures": "failed trials in a row that stop a driver",
}
SOURCE = "study set"  # how a SpecError names what it checked


def check_controls(items: list[str], recorded: dict[str, Any] | None, name: str) -> dict[str, Any]:
    """`key=value` strings -> {dotted key: validated value} (e.g. timeout=2h -> 7200.0).

    `recorded`: the study's recorded spec (its defining parts, spec_guard.py), so that the values
    are checked in context; None checks them alone. SpecError names every problem at once."""
    parsed = parse_overrides(items)
    if not parsed:
        raise SpecError(SOURCE, [f"give at least one key=value, e.g. n_trials=60 (run controls: {', '.join(RUN_CONTROLS)})"])
    unknown = [k for k in parsed if k not in RUN_CONTROLS]
    if unknown:
        raise SpecError(SOURCE, [f"{k}: not a run control; `study set` changes {', '.join(RUN_CONTROLS)} (the rest of a spec "
                                 "says what a trial means: change it in the spec and run it with --allow-spec-change)" for k in unknown])
    base = {"name": name, "experiment": "(recorded)"}
    if recorded and _valid({**recorded, **base}):  # (one this version reads otherwise: the values are checked alone)
        base = {**recorded, **base}
    try:
        spec = StudySpec.model_validate(apply_overrides(base, parsed))
    except ValidationError as e:
        raise SpecError(SOURCE, validation_messages(e)) from None
    return {k: value_at(spec, k) for k in parsed}


def _valid(raw: dict[str, Any]) -> bool:
    try:
        StudySpec.model_validate(raw)
        return True
    except ValidationError:
        return False


def value_at(spec: StudySpec, key: str) -> Any:
    """The spec's value at a dotted key ("budget.epochs")."""
    node: Any = spec
    for part in key.split("."):
        node = getattr(node, part)
    return node


def with_controls(spec: StudySpec, values: dict[str, Any]) -> StudySpec:
    """`spec` with the run controls `values` ({dotted key: value}) applied, validated as a spec is;
    SpecError when they do not fit this spec."""
    raw = spec.model_dump(mode="json")
    if raw.get("objectives"):  # metric/direction are filled in from them (objectives.fill_primary)
        raw.pop("metric"), raw.pop("direction")
    raw = apply_overrides(raw, values)
    try:
        new = StudySpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(SOURCE, validation_messages(e)) from None
    new._project_dir = spec.project_dir  # (where the spec was found: not a field)
    return new
