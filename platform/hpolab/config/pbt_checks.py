"""What a PBT spec's schedule and mutations must allow, checked when the spec is validated (each one
line naming the field and the fix), so no member fails at its first exploit:

- a boundary before trainer.max_epochs (interval_epochs < max_epochs): else PBT never exploits;
- factors > 0 (a value times a negative factor changes sign);
- a trainer key's mutated values inside that key's own bounds (the training routine's checks:
  `lr must be > 0`), for a range's ends and every choice;
- a model key whose mutation changes the model's tensor shapes (a width, a depth): a member resumes
  its donor's checkpoint with the mutated value, and its state dict no longer fits. Found by building
  the experiment's model with the spec's value and the mutated ones (an own training loop builds its
  model itself: not checked). Searching such a key is fine (an exploit takes the donor's whole config).
"""

from __future__ import annotations

import dataclasses
from typing import Any


def pbt_problems(spec, experiment) -> list[str]:
    ts = spec.trial_scheduler
    top = spec.trainer.max_epochs
    problems = []
    if ts.interval_epochs >= top:
        problems.append(f"trial_scheduler.interval_epochs: {ts.interval_epochs} leaves no boundary before trainer.max_epochs ({top}): "
                        f"members would never exploit or explore; use interval_epochs < {top}")
    probe = _ModelProbe(spec, experiment)
    for key, m in ts.mutations.items():
        section, name = key.split(".", 1)
        factor = getattr(m, "factor", None)
        if factor is not None and min(factor) <= 0:
            problems.append(f"trial_scheduler.mutations.{key}.factor: {list(factor)}: factors must be > 0 (a negative one changes the sign)")
            continue
        if section == "trainer" and name in {f.name for f in dataclasses.fields(spec.trainer)}:
            bad = _trainer_refuses(spec, name, _candidates(m, getattr(spec.trainer, name)))
            if bad:
                problems.append(f"trial_scheduler.mutations.{key}: {bad}; keep the mutation inside trainer.{name}'s bounds")
        elif section == "model":
            changed = probe.changes_shapes(name, m)
            if changed:
                problems.append(f"trial_scheduler.mutations.{key}: changes the model's tensor shapes ({changed}): a member cannot "
                                f"resume its donor's checkpoint with another {name}; search {key} in search_space instead of mutating it")
    return problems


def _candidates(m, base: Any) -> list[Any]:
    """The values a mutation may give (a range's ends, every choice, the base times each factor)."""
    if getattr(m, "range", None) is not None:
        return list(m.range)
    if getattr(m, "choices", None) is not None:
        return list(m.choices)
    if base is None or isinstance(base, bool) or not isinstance(base, (int, float)):
        return []
    return [max(1, round(base * f)) if isinstance(base, int) else base * f for f in m.factor]


def _trainer_refuses(spec, name: str, values: list[Any]) -> str | None:
    """The training routine's own check of the first value it refuses (None: it takes them all)."""
    for v in values:
        try:
            dataclasses.replace(spec.trainer, **{name: v})
        except (ValueError, TypeError) as e:
            return f"{name}={v!r}: {e}"
    return None


class _ModelProbe:
    """The experiment's model built with one model key changed: which tensors change shape."""

    def __init__(self, spec, experiment):
        self.spec, self.experiment = spec, experiment
        self._config: dict | None = None
        self._data = None

    def changes_shapes(self, name: str, m) -> str | None:
        if not hasattr(self.experiment, "build_model") or not hasattr(self.experiment, "load_data"):
            return None  # an own training loop builds its model itself
        try:
            base = self._shapes(name, None)
            for value in _candidates(m, self._model_config().get(name)):
                other = self._shapes(name, value)
                changed = sorted(k for k in base.keys() | other.keys() if base.get(k) != other.get(k))
                if changed:
                    return f"{name}={value!r}: {', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}"
        except Exception:  # the model or data cannot be built here (the spec's check of the experiment says so elsewhere)
            return None
        return None

    def _model_config(self) -> dict:
        if self._config is None:
            self._config = self.spec.resolved_config(self.experiment, {})
        return self._config["model"]

    def _shapes(self, name: str, value: Any) -> dict[str, tuple]:
        if self._data is None:
            self._data = self.experiment.load_data(self._config_all()["data"], self.spec.seed)
        model = {**self._model_config(), **({name: value} if value is not None else {})}
        built = self.experiment.build_model(model, self._data.input_shape, self._data.num_classes)
        return {k: tuple(v.shape) for k, v in built.state_dict().items()}

    def _config_all(self) -> dict:
        self._model_config()
        return self._config
