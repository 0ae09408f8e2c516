"""The one interface between the driver and a trial scheduler (ASHA: asha.py; PBT: pbt.py).

A trial scheduler pauses trials at epochs it chooses and resumes them later from a checkpoint. The
driver does the mechanics (a pause is a stop at `pause_epoch`: checkpoint written, process ended,
Optuna trial kept RUNNING with a paused mark, MLflow run kept open); the scheduler only decides:

    pause_epoch(trial, start_epoch)  where the segment that starts training at `start_epoch` pauses
    rung_index(trial, epoch)         which rung (ASHA) or boundary (PBT) `epoch` is for the trial, if any
    top_epochs()                     the epochs a trial trains in all (its trainer.max_epochs)
    next_resume(trials)              which paused trial resumes now (called under the budget lock; with
                                     goes_on_when_next, also at a pause point: see driver/pauses.py's go_on)
    may_start_new(trials)            whether a new configuration may be sampled now
    at_end(paused)                   what the trials still paused become when nothing can run

A paused trial's state lives in the Optuna storage only (so a re-run, or another worker, sees it): the
marks and the transitions that write them are the trial lifecycle's (stores/trial_states.py: paused,
put back; study/state/lifecycle.py: pause, resume_claimed, put_back, ended_paused). RUNG_ATTR (user
attr: the highest rung reached) and CHANGES_ATTR (the config changes applied so far) are read here.

The scheduler never writes to Optuna or MLflow itself: what it wants recorded comes back in its Resume
(config changes, user attrs, run tags), written by the driver (pauses.py) inside its storage-outage
guard. (PBT does copy and delete checkpoint files in the trial folders: its boundary snapshots.)

schedulers.py picks the spec's scheduler (scheduler_for); the schedulers import this module only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from optuna.trial import FrozenTrial

from hpolab.stores.trial_states import chain_root, last_pause, paused_mark  # noqa: F401 -- chain_root: the schedulers' retry-chain rule is the budget's
from hpolab.study.state.lifecycle import CHANGES as CHANGES_ATTR  # noqa: F401 -- the marks the lifecycle writes (study/state/lifecycle.py)
from hpolab.study.state.lifecycle import RUNG as RUNG_ATTR  # noqa: F401


@dataclass
class Resume:
    number: int  # the paused trial to resume now (its Optuna trial and MLflow run are kept)
    checkpoint: Path  # the file it resumes from (ASHA: its own last.pt; PBT: maybe a copy of another member's)
    config_changes: dict[str, Any] = field(default_factory=dict)  # dotted config keys -> values for this segment on
    attrs: dict[str, Any] = field(default_factory=dict)  # user attrs to set on its Optuna trial (PBT: its schedule, parents)
    tags: dict[str, str] = field(default_factory=dict)  # set on its MLflow run when it resumes (e.g. hpolab.rung)
    params: dict[str, float] = field(default_factory=dict)  # metrics logged at the resume epoch (PBT: the schedule)
    source: Path | None = None  # where its weights come from, when not its checkpoint's own (PBT: the donor's boundary copy)


class TrialScheduler(Protocol):
    fails_never_finite: bool  # a trial with no finite value of the study metric at its pause point fails there (else: ranked worst)
    goes_on_when_next: bool  # next_resume only reads: a trial at its pause point that it would name next goes on in its process

    def pause_epoch(self, trial: FrozenTrial, start_epoch: int) -> int | None:
        """The epoch after which the segment starting at `start_epoch` pauses (None: it runs to the end)."""

    def rung_index(self, trial: FrozenTrial, epoch: int) -> int | None:
        """The 0-based rung (PBT: boundary) of the trial at `epoch`; None when `epoch` is none of them."""

    def top_epochs(self) -> int:
        """The epochs every trial trains in all (its trainer.max_epochs: its LR schedule spans them)."""

    def next_resume(self, trials: list[FrozenTrial]) -> Resume | None:
        """The paused trial to resume now, or None. Called under the budget lock, before a new trial is asked."""

    def may_start_new(self, trials: list[FrozenTrial]) -> bool:
        """Whether a new configuration may be sampled (n_trials and the epoch budget are the driver's)."""

    def at_end(self, paused: list[FrozenTrial]) -> list[tuple[int, str, dict[str, str]]]:
        """(number, "PRUNED" | "COMPLETE", run tags) for each trial still paused when nothing can run."""


def paused_at(trial: FrozenTrial) -> dict[str, int] | None:
    """{"rung": k, "epoch": e, ...} when the trial is paused (or put back) now, else None (stores/trial_states.py)."""
    return paused_mark(trial)


def score(value: float | None, maximize: bool) -> float:
    """A value at a rung or boundary, larger is better (the direction folded in); NaN and missing are worst."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return -math.inf
    return value if maximize else -value


def interrupted_resume(trials: list[FrozenTrial], checkpoint_of) -> Resume | None:
    """A paused trial whose segment died with its driver (put back: its mark has "interrupted"): it resumes
    first and unconditionally, from its own newest checkpoint (`checkpoint_of(number)`), towards the pause
    point its segment was heading for (its promotion or boundary decision was made before it started)."""
    for t in trials:
        info = paused_at(t)
        if info is not None and info.get("interrupted"):
            return Resume(number=t.number, checkpoint=checkpoint_of(t.number))
    return None


def best_at_highest_rung(trials, direction: str) -> tuple[FrozenTrial, int] | None:
    """(trial, epoch): of the trials that paused at a rung (paused now or ended there), the best at
    the highest rung epoch any of them reached; None when none paused. What a study that ended
    before any trial reached the top rung (its epoch budget spent) has to show for its epochs (None too
    when no value there is finite)."""
    from hpolab.study.objectives.ranking import best_value

    at = {t.number: last_pause(t) for t in trials}
    epochs = {n: int(info["epoch"]) for n, info in at.items() if info is not None}
    if not epochs:
        return None
    top = max(epochs.values())
    there = [t for t in trials if epochs.get(t.number) == top and math.isfinite(t.intermediate_values.get(top, math.nan))]
    value = best_value([t.intermediate_values[top] for t in there], direction)
    return next(((t, top) for t in there if t.intermediate_values[top] == value), None)
