"""ASHA: asynchronous successive halving by promotion (Li et al. 2020; Syne Tune's promotion type).

Bracket s (the configuration's first trial number mod `brackets`) has rungs at
min_epochs * eta^(s+k) epochs for k = 0, 1, ... while below max_epochs, then max_epochs itself. A trial
trains to its next rung and pauses there. A paused trial is promoted (resumes from its checkpoint to
the next rung) once it is in the top floor(n/eta) of the n trials of its bracket that reached its rung;
the highest rung is looked at first. Whatever is still paused when nothing can run is PRUNED.

Pure logic on Optuna's trials: the value of a trial at a rung is its intermediate value at the rung's
epoch, compared in the spec's direction (ranking.py's rule: NaN is worst).
"""

from __future__ import annotations

import math
from pathlib import Path

from optuna.trial import FrozenTrial, TrialState

from hpolab.study.objectives.trial_scheduler import RUNG_ATTR, Resume, chain_root, interrupted_resume, paused_at, score

COUNTED = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)  # a FAIL's epochs live on in its retry copy


def rungs(min_epochs: int, max_epochs: int, eta: int, bracket: int = 0) -> list[int]:
    """The epochs at which trials of `bracket` are compared; the last is max_epochs (completion)."""
    out, k = [], 0
    while min_epochs * eta ** (bracket + k) < max_epochs:
        out.append(min_epochs * eta ** (bracket + k))
        k += 1
    return out + [max_epochs]


class Asha:
    """The ASHA trial scheduler (trial_scheduler.py's interface)."""

    fails_never_finite = True  # a trial with no finite value at its rung fails there (nothing ranks it; never promoted)
    goes_on_when_next = True  # a trial promoted as it reaches its rung trains on in its process (driver/pauses.py's go_on)

    def __init__(self, spec, stores=None, *, min_epochs: int | None = None, max_epochs: int | None = None,
                 eta: int | None = None, brackets: int | None = None, direction: str | None = None):
        ts = spec.trial_scheduler if spec is not None else None
        self.min_epochs = min_epochs or ts.min_epochs
        self.max_epochs = max_epochs or (ts.max_epochs if ts and ts.max_epochs else spec.trainer.max_epochs)
        self.eta = eta or ts.reduction_factor
        self.brackets = brackets or ts.brackets
        self.maximize = (direction or spec.direction) == "maximize"
        self.stores, self.study_name = stores, (spec.name if spec is not None else "")

    def bracket_of(self, trial: FrozenTrial) -> int:
        return chain_root(trial) % self.brackets

    def rungs_of(self, trial: FrozenTrial) -> list[int]:
        return rungs(self.min_epochs, self.max_epochs, self.eta, self.bracket_of(trial))

    def top_epochs(self) -> int:
        """trainer.max_epochs of every trial: its LR schedule spans the whole training."""
        return self.max_epochs

    def pause_epoch(self, trial: FrozenTrial, start_epoch: int) -> int | None:
        for epoch in self.rungs_of(trial)[:-1]:
            if epoch >= start_epoch:
                return epoch
        return None

    def rung_index(self, trial: FrozenTrial, epoch: int) -> int | None:
        r = self.rungs_of(trial)
        return r.index(epoch) if epoch in r else None

    def _value(self, trial: FrozenTrial, epoch: int) -> float:
        return score(trial.intermediate_values.get(epoch), self.maximize)

    def promotable(self, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        """Paused trials that may resume now, best first, highest rung first."""
        out = []
        by_bracket: dict[int, list[FrozenTrial]] = {}
        for t in trials:
            if t.state in COUNTED:
                by_bracket.setdefault(self.bracket_of(t), []).append(t)
        for bracket, members in sorted(by_bracket.items()):
            rs = rungs(self.min_epochs, self.max_epochs, self.eta, bracket)
            for k in reversed(range(len(rs) - 1)):
                epoch = rs[k]
                reached = [t for t in members if epoch in t.intermediate_values]
                # ties: the earlier configuration first (stable, and the same answer on every worker)
                ranked = sorted(reached, key=lambda t: (-self._value(t, epoch), chain_root(t)))
                top = [t for t in ranked[: len(reached) // self.eta] if self._value(t, epoch) != -math.inf]  # (NaN: never promoted)
                out += [(k, -self._value(t, epoch), t) for t in top if (paused_at(t) or {}).get("epoch") == epoch]
        return [t for _, _, t in sorted(out, key=lambda x: (-x[0], x[1], x[2].number))]

    def checkpoint_of(self, number: int) -> Path:
        return self.stores.trial_dir(self.study_name, number) / "last.pt" if self.stores else Path("last.pt")

    def next_resume(self, trials: list[FrozenTrial]) -> Resume | None:
        first = interrupted_resume(trials, self.checkpoint_of)  # (a segment its dead driver never finished)
        if first is not None:
            return first
        ready = self.promotable(trials)
        if not ready:
            return None
        t = ready[0]
        epoch = paused_at(t)["epoch"]
        k = self.rung_index(t, epoch)
        return Resume(number=t.number, checkpoint=self.checkpoint_of(t.number), tags={"hpolab.promoted_from_rung": str(k)})

    def may_start_new(self, trials: list[FrozenTrial]) -> bool:
        return True  # n_trials and the epoch budget decide (the driver's)

    def at_end(self, paused: list[FrozenTrial]) -> list[tuple[int, str, dict[str, str]]]:
        out = []
        for t in paused:
            info = paused_at(t) or {}
            rung = t.user_attrs.get(RUNG_ATTR, info.get("rung"))
            out.append((t.number, "PRUNED", {"hpolab.pruned_at_rung": str(rung), "hpolab.pruned_at_epoch": str(info.get("epoch")),
                                             "hpolab.stop_reason": "asha_not_promoted"}))
        return out
