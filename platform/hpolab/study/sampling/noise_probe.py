"""`noise_probe: {seeds: 3, every: 25}`: the study measures its own noise floor while it runs.

After every `every` results (COMPLETE and PRUNED trials; a probe's are none), the best trial so far
(the incumbent) is queued again as `seeds` seed trials (study/sampling/seed_trials.py): its params,
new training seeds (the study's seed + PROBE_SEED_OFFSET + k, never a race's), the same data split.
They are ordinary trials of the study (their own processes and runs; the sampler sees them as the
incumbent measured again), counted in n_trials like any trial that trains, and marked with the system
attr NOISE_PROBE (the incumbent's number): never a result, never the best (ranking.py), never counted
by the stop rules, shown as such by `study status` and `compare`.

The noise floor is the pooled standard deviation, over the probed incumbents, of each one's value
together with its probes' (a pruned probe gives none); it is written to the study attr NOISE_FLOOR
(source noise_probe) once a probe finished, unless a promotion race measured one (noise.py).
Queued under the budget lock, only where the budget has room; the rounds done are the study attr
PROBES ({incumbent, seeds} each), so a re-run or another worker never queues a round twice.
"""

from __future__ import annotations

import time
from typing import Callable

from optuna.trial import TrialState

from hpolab.stores.budget_lock import budget_lock
from hpolab.stores.optuna_sql import NOISE_PROBE
from hpolab.stores.trial_states import is_imported
from hpolab.stores.trial_counts import in_budget
from hpolab.study.objectives import ranking
from hpolab.study.objectives.noise import NOISE_FLOOR, noise_floor, pooled_sd
from hpolab.study.sampling.seed_trials import queue_seed_trial
from hpolab.study.state.budget import trial_counts

PROBES = "hpolab.noise_probes"  # Optuna study user attr: the probe rounds queued so far
PROBE_SEED_OFFSET = 1000  # a probe's seeds: the study's seed + 1000 + k (a race's start at + 1)


class NoiseProbe:
    """The driver calls `step()` before it starts trials."""

    def __init__(self, spec, study, storage, note: Callable[[str], None]):
        self.spec, self.study, self.storage, self.note = spec, study, storage, note
        self._measured = -1  # probe trials finished when the floor was last written

    def step(self) -> None:
        if self.spec.noise_probe is None:
            return
        trials = self.study.get_trials(deepcopy=False)
        self._update_floor(trials)
        results = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) and not t.system_attrs.get(NOISE_PROBE)
                      and not is_imported(t) for t in trials)
        if results // self.spec.noise_probe.every > len(self.study.user_attrs.get(PROBES) or []):
            self._queue()

    def _queue(self) -> None:
        rule = self.spec.noise_probe
        with budget_lock(self.storage, self.spec.name):
            done = list(self.study.user_attrs.get(PROBES) or [])  # (read again under the lock: another worker's)
            trials = self.study.get_trials(deepcopy=False)
            results = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) and not t.system_attrs.get(NOISE_PROBE)
                          and not is_imported(t) for t in trials)
            incumbent = ranking.best(trials, [self.spec.direction])
            room = self.spec.n_trials - in_budget(trial_counts(self.study))
            if results // rule.every <= len(done) or incumbent is None or room < rule.seeds:
                return
            first = self.spec.seed + PROBE_SEED_OFFSET + len(done) * rule.seeds
            seeds = list(range(first, first + rule.seeds))
            for seed in seeds:
                queue_seed_trial(self.study, seed, params=incumbent.params, system_attrs={NOISE_PROBE: incumbent.number})
            self.study.set_user_attr(PROBES, [*done, {"incumbent": incumbent.number, "seeds": seeds}])
        self.note(f"noise probe: trial {incumbent.number} (the best so far) queued again on seeds "
                  f"{', '.join(map(str, seeds))}: its spread over seeds is the study's noise floor")

    def _update_floor(self, trials) -> None:
        probes = [t for t in trials if t.system_attrs.get(NOISE_PROBE) is not None and t.state == TrialState.COMPLETE]
        if len(probes) == self._measured:
            return
        self._measured = len(probes)
        record = self.study.user_attrs.get(NOISE_FLOOR) or {}
        if not probes or (noise_floor(self.study.user_attrs) is not None and record.get("source") == "race"):
            return
        by_number = {t.number: t for t in trials}
        groups: dict[int, list[float]] = {}
        for t in probes:
            groups.setdefault(t.system_attrs[NOISE_PROBE], []).append(float(t.value))
        floor, dof = pooled_sd([[float(by_number[n].value), *vs] for n, vs in groups.items()
                                if by_number[n].value is not None])
        if floor is not None:
            self.study.set_user_attr(NOISE_FLOOR, {"value": floor, "metric": self.spec.metric, "source": "noise_probe", "dof": dof,
                                                   "configurations": len(groups), "runs": len(probes) + len(groups),
                                                   "at": time.strftime("%Y-%m-%d %H:%M:%S")})
