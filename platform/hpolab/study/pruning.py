"""Each epoch's value to the pruner, and its verdict -- for one objective and for several.

One objective: the trial itself (`trial.report`, `trial.should_prune`), as Optuna intends.

Several: Optuna refuses `report`/`should_prune` in a multi-objective study (optuna#3450). The
spec's pruning metric (config/objectives.py) is then reported to a companion single-objective
study in the same storage, `<study>~pruning` (a name no user study can have: '~' is not allowed),
with the spec's pruner and the pruning metric's direction. Each trial gets its own companion
trial (user attr `hpolab.trial` = the real trial's number) that receives its epochs and ends in
the same state, so Optuna's own pruners -- median, percentile, successive halving, hyperband,
... -- decide on the learning curves of every worker's trials, exactly as in a one-metric study.
The companion study holds no parameters and no sampler state: it is not a study of its own, and
`study list` does not show it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from hpolab.config.samplers import make_pruner
from hpolab.stores.studies import COMPANION_SUFFIX
from hpolab.study.outage import passthrough



def companion_name(study_name: str) -> str:
    return study_name + COMPANION_SUFFIX


class Pruning:
    """report(r, value, epoch) and should_prune(r) for the driver's running trial `r`."""

    def __init__(self, spec=None, storage=None, guard: Callable[..., Any] = passthrough):
        self.guard = guard
        self.companion: optuna.Study | None = None
        self.trials: dict[int, optuna.Trial] = {}
        if spec is not None and spec.is_multi_objective:
            self.companion = guard(optuna.create_study, storage=storage, study_name=companion_name(spec.name),
                                   direction=spec.direction, pruner=make_pruner(spec),
                                   sampler=optuna.samplers.RandomSampler(seed=0), load_if_exists=True)

    def _target(self, r) -> optuna.Trial:
        if self.companion is None:
            return r.trial
        t = self.trials.get(r.number)
        if t is None:
            t = self.guard(self.companion.ask)
            self.guard(t.set_user_attr, "hpolab.trial", r.number)
            self.trials[r.number] = t
        return t

    def report(self, r, value: float, epoch: int) -> None:
        """May raise UpdateFinishedTrialError (one objective: another worker reaped the trial)."""
        self.guard(self._target(r).report, value, epoch)

    def should_prune(self, r) -> bool:
        return bool(self.guard(self._target(r).should_prune))

    def finish(self, r, state: TrialState, value: float | None) -> None:
        """End the companion trial like the real one (several objectives; nothing to do for one)."""
        t = self.trials.pop(r.number, None)
        if t is None:
            return
        ok = state == TrialState.COMPLETE and value is not None and math.isfinite(value)
        try:
            self.guard(self.companion.tell, t, value if ok else None,
                       state=None if ok else (TrialState.PRUNED if state == TrialState.PRUNED else TrialState.FAIL),
                       skip_if_finished=True)
        except Exception:  # the real trial's end is recorded; a companion left RUNNING only misses one curve
            pass
