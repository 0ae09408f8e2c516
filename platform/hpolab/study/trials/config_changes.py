"""What a resumed attempt's config changed from its checkpoint's, and giving those changes to an optimizer.

A trial scheduler resumes a trial with new values (PBT's explore: `trainer.lr` 0.003 -> 0.0027), and a
retry after a CUDA OOM with a halved batch. The loop builds its objects from `config` (the new values)
and then restores their state from the checkpoint: an optimizer's `load_state_dict` brings back the
checkpoint's learning rate, weight decay and momentum with its moments, and an LR schedule its base
LRs. `trial.config_changes` says what changed; `trial.apply_config_changes(optimizer, schedulers)`
gives the restored optimizer the new `trainer.lr` (scaled along its schedule: the schedule goes on at
its step, from the new peak), `trainer.weight_decay` (groups without decay keep none), `momentum` and
`betas`, as the platform's routine does on such a resume. A loop under PBT that never looks at the
changes of its mutated keys is refused (ContractError): its records would say it trained with values
it never used.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from hpolab.study.trials.trial_contract import ContractError

OPTIMIZER_KEYS = ("trainer.lr", "trainer.weight_decay", "trainer.momentum", "trainer.betas")


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


class ConfigChanges:
    """The changes of one attempt: {dotted key: (checkpoint's value, this attempt's value)}."""

    def __init__(self, config: dict[str, Any], saved: dict[str, Any] | None, scheduler_keys: Iterable[str] = ()):
        self.scheduler_keys = tuple(scheduler_keys)  # PBT's mutated keys: the loop must look at their changes
        now, before = _flat(config), _flat(saved or {})
        self.changes = {k: (before[k], v) for k, v in now.items() if k in before and _norm(before[k]) != _norm(v)}
        self._read = False

    def read(self) -> dict[str, Any]:
        self._read = True
        return {k: new for k, (_, new) in self.changes.items()}

    def check_read(self) -> None:
        """ContractError when the attempt's first report comes and the loop never read changes a trial
        scheduler made to its mutated keys."""
        unread = {k: v for k, v in self.changes.items() if k in self.scheduler_keys}
        if unread and not self._read:
            shown = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in unread.items())
            raise ContractError(f"this attempt resumed with the trial scheduler's changes {shown}, and train() never read "
                                "trial.config_changes: an optimizer restored from the checkpoint keeps its old settings; call "
                                "trial.apply_config_changes(optimizer, schedulers) after restoring it (or read trial.config_changes)")

    def apply(self, optimizer, schedulers: Any = ()) -> list[str]:
        """The optimizer keys changed, given to `optimizer`'s param groups and `schedulers`' base LRs."""
        self._read = True
        schedulers = [s for s in (schedulers if isinstance(schedulers, (list, tuple)) else [schedulers]) if s is not None]
        applied = [k for k in OPTIMIZER_KEYS if k in self.changes]
        groups = optimizer.param_groups
        if "trainer.lr" in self.changes:
            old, new = self.changes["trainer.lr"]
            ratio = float(new) / float(old)
            for g in groups:  # (initial_lr: any torch schedule's peak; max_lr, min_lr: OneCycleLR's)
                for k in ("lr", "initial_lr", "max_lr", "min_lr"):
                    if isinstance(g.get(k), (int, float)):
                        g[k] *= ratio
            for s in schedulers:
                if hasattr(s, "base_lrs"):
                    s.base_lrs = [b * ratio for b in s.base_lrs]
                if hasattr(s, "_last_lr"):
                    s._last_lr = [g["lr"] for g in groups]
        if "trainer.weight_decay" in self.changes:
            old, new = self.changes["trainer.weight_decay"]
            for g in groups:  # a group without decay (biases, norms) keeps none
                if isinstance(g.get("weight_decay"), (int, float)) and math.isclose(g["weight_decay"], float(old)):
                    g["weight_decay"] = float(new)
        for key, name in (("trainer.momentum", "momentum"), ("trainer.betas", "betas")):
            if key in self.changes:
                for g in groups:
                    if name in g:
                        g[name] = tuple(self.changes[key][1]) if name == "betas" else float(self.changes[key][1])
        return applied
