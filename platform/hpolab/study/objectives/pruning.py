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
from hpolab.study.objectives.objective_values import VALUES_ATTR
from hpolab.study.state.outage import passthrough



def companion_name(study_name: str) -> str:
    return study_name + COMPANION_SUFFIX


class Pruning:
    """report(r, value, epoch) and should_prune(r) for the driver's running trial `r`."""

    def __init__(self, spec=None, storage=None, guard: Callable[..., Any] = passthrough):
        self.guard = guard
        self.companion: optuna.Study | None = None
        self.trials: dict[int, optuna.Trial] = {}
        self.metric = spec.metric if spec is not None else None
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
        except Exception:  # the real trial's end is recorded; close_orphans() ends the companion later
            pass

    def close_orphans(self, study: optuna.Study) -> int:
        """Companion trials left RUNNING by a driver that died (its real trial was reaped, or ended
        while the companion's tell was lost) end like their real trial, so the pruner does not count
        a curve that will never grow. A companion trial whose real trial still runs (here or on
        another worker) is left alone, and so is one whose driver died before it recorded
        `hpolab.trial` (it holds no report). Returns how many were told."""
        if self.companion is None:
            return 0
        mine = {t._trial_id for t in self.trials.values()}
        open_ = [t for t in self.guard(self.companion.get_trials, deepcopy=False, states=(TrialState.RUNNING,))
                 if t._trial_id not in mine and "hpolab.trial" in t.user_attrs]
        if not open_:
            return 0
        alive = {t.number for t in self.guard(study.get_trials, deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))}
        open_ = [c for c in open_ if int(c.user_attrs["hpolab.trial"]) not in alive]  # other live workers' (one read)
        storage, closed = study._storage, 0
        for c in open_:
            try:  # only the real trials asked about (a study may hold thousands)
                t = self.guard(storage.get_trial, self.guard(storage.get_trial_id_from_study_id_trial_number,
                                                             study._study_id, int(c.user_attrs["hpolab.trial"])))
            except KeyError:
                continue
            if not t.state.is_finished():
                continue
            value = _pruning_value(t, c, self.metric) if t.state == TrialState.COMPLETE else None
            state = None if value is not None else TrialState.PRUNED if t.state == TrialState.PRUNED else TrialState.FAIL
            try:
                self.guard(self.companion.tell, c.number, value, state=state, skip_if_finished=True)
                closed += 1
            except optuna.exceptions.UpdateFinishedTrialError:  # another worker closed it first
                pass
        return closed


def _pruning_value(t, companion_trial, metric: str | None) -> float | None:
    """What the companion of COMPLETE real trial `t` would have been told: the pruning metric's
    recorded value (at the best epoch), else the companion's last reported epoch value."""
    v = (t.user_attrs.get(VALUES_ATTR) or {}).get(metric)
    if v is None and companion_trial.intermediate_values:
        v = companion_trial.intermediate_values[max(companion_trial.intermediate_values)]
    return float(v) if v is not None and math.isfinite(v) else None
