"""A trial's hpolab state: what each stored trial is, read from Optuna's state and hpolab's marks.

Optuna knows WAITING, RUNNING, COMPLETE, PRUNED and FAIL. hpolab's trials live a richer life (a
trial scheduler pauses them, a dead driver's segment is put back, a worker gives a trial back unrun,
a warm start imports another study's), kept as marks on the Optuna trial. This module is the one
place that reads those marks: every reader and writer asks `state_of` (or the helpers below) and
none tests `hpolab.paused` or "RUNNING but ..." itself (tests/test_layout.py checks that).

    state       Optuna     marks                                         the driver's meaning
    waiting     WAITING                                                  enqueued, a retry copy or a seed trial: the next ask() takes it
    claimed     RUNNING    owner record, no user attr mlflow_run_id      a driver took it; its MLflow run is not made yet
    running     RUNNING    mlflow_run_id                                 a process trains it (dead owner: the reaper's)
    paused      RUNNING    hpolab.paused {rung, epoch}                    a trial scheduler paused it: no process, run open
    put back    RUNNING    hpolab.paused {..., interrupted: true}         a dead driver's segment, paused again: resumes first
    complete    COMPLETE
    pruned      PRUNED     (hpolab.paused kept: ended at a rung)
    failed      FAIL
    retried     FAIL       its number in a later trial's retry_history    an attempt a retry copy continues: no result
    released    FAIL       hpolab.released                               given back unrun (the budget was full): no result
    imported    any        hpolab.imported_from                          a warm start's copy of another study's trial

The transitions between these states are data here (TRANSITIONS: from and to which states, what
each writes, in which study kinds a driver passes it); the functions that make them, writing Optuna
and MLflow together, are study/state/lifecycle.py. Plain data in, no Optuna: the SQL readers' rows
(optuna_sql.py) and Optuna's FrozenTrial both fit, so `study status` and `study list` import this
module without Optuna. A reader that did not read a trial's run id (`study list`) sees claimed
trials as running.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable

IMPORTED = "hpolab.imported_from"  # system attr of a trial a warm start imported (study/sampling/warm_start.py)
PAUSED = "hpolab.paused"  # system attr {rung, epoch[, interrupted, after, logged]} while paused; None once resumed
RELEASED = "hpolab.released"  # system attr of a trial given back unrun because the budget was already full
RETRY_HISTORY = "retry_history"  # system attr of a retry copy: the numbers of the attempts it continues (the first: its chain's root)
RUN_ID = "mlflow_run_id"  # user attr: the trial's MLflow run (set when the run is made)
OWNER = "hpolab.owner"  # user attr: the driver that owns it (study/state/owners.py)


class State(str, Enum):
    WAITING = "waiting"
    CLAIMED = "claimed"
    RUNNING = "running"
    PAUSED = "paused"
    PUT_BACK = "put back"
    COMPLETE = "complete"
    PRUNED = "pruned"
    FAILED = "failed"
    RETRIED = "retried"
    RELEASED = "released"
    IMPORTED = "imported"


OWNED = frozenset({State.CLAIMED, State.RUNNING})  # a driver holds it (a dead one's: reclaimed, reaped or put back)
PAUSED_STATES = frozenset({State.PAUSED, State.PUT_BACK})  # no process, not finished: a trial scheduler resumes it
FINISHED = frozenset({State.COMPLETE, State.PRUNED, State.FAILED})  # a result of the study
ASIDE = frozenset({State.RETRIED, State.RELEASED, State.IMPORTED})  # counted nowhere: no result of this study
_UNREAD = object()


def optuna_state(trial: Any) -> str:
    """The Optuna state's name ("RUNNING", ...): `trial.state` may be a TrialState or its name."""
    return str(getattr(trial.state, "name", trial.state)).upper()


def run_id_of(trial: Any) -> Any:
    """The trial's MLflow run id, None when it has none, _UNREAD when the reader did not read it."""
    if hasattr(trial, "run_id"):
        return trial.run_id
    attrs = getattr(trial, "user_attrs", None)
    return attrs.get(RUN_ID) if attrs is not None else _UNREAD


def paused_mark(trial: Any) -> dict[str, Any] | None:
    """The paused mark ({rung, epoch, ...}) of a trial paused or put back now, else None."""
    mark = trial.system_attrs.get(PAUSED)
    return mark if optuna_state(trial) == "RUNNING" and isinstance(mark, dict) else None


def seen_paused(t: Any, rung: int, epoch: int) -> Any:
    """A copy of trial `t` as it would be once paused at `epoch` (its paused mark; nothing written):
    what a claim right after the pause would read (driver/pauses.py's go_on)."""
    view = copy.copy(t)
    view.system_attrs = {**t.system_attrs, PAUSED: {"rung": rung, "epoch": epoch}}
    return view


def state_of(trial: Any, retried: Iterable[int] = ()) -> State:
    """The hpolab state of `trial` (a FrozenTrial, or a SQL reader's row: number, state, system_attrs
    and maybe run_id / user_attrs). `retried`: the numbers retry copies continue (retried_numbers)."""
    attrs, optuna = trial.system_attrs, optuna_state(trial)
    if attrs.get(RELEASED):
        return State.RELEASED
    if attrs.get(IMPORTED):
        return State.IMPORTED
    if optuna == "WAITING":
        return State.WAITING
    if optuna == "RUNNING":
        mark = paused_mark(trial)
        if mark is not None:
            return State.PUT_BACK if mark.get("interrupted") else State.PAUSED
        return State.CLAIMED if run_id_of(trial) is None else State.RUNNING
    if optuna == "FAIL":
        return State.RETRIED if trial.number in retried else State.FAILED
    return State.COMPLETE if optuna == "COMPLETE" else State.PRUNED


def retried_numbers(trials: Iterable) -> set[int]:
    """Numbers of the attempts some retry copy continues."""
    return {n for t in trials for n in (t.system_attrs.get(RETRY_HISTORY) or [])}


def states(trials: Iterable) -> list[tuple[Any, State]]:
    """(trial, its state) for each of `trials`, the retried ones known from the whole list."""
    trials = list(trials)
    retried = retried_numbers(trials)
    return [(t, state_of(t, retried)) for t in trials]


def is_imported(trial: Any) -> bool:
    """A warm start's copy of another study's trial: history for the sampler, no result of this study."""
    return bool(trial.system_attrs.get(IMPORTED))


def is_paused(trial: Any) -> bool:
    """Paused or put back now: no process, not finished (a trial scheduler resumes it)."""
    return paused_mark(trial) is not None


def ended_at_rung(trial: Any) -> bool:
    """Ended PRUNED while paused (never promoted or resumed): the trial scheduler's end of it."""
    return optuna_state(trial) == "PRUNED" and PAUSED in trial.system_attrs


def last_pause(trial: Any) -> dict[str, Any] | None:
    """The mark of the last pause of a trial paused now or ended at a rung (PRUNED while paused), else None."""
    mark = trial.system_attrs.get(PAUSED)
    return mark if isinstance(mark, dict) and optuna_state(trial) in ("RUNNING", "PRUNED") else None


def ever_paused(trial: Any) -> bool:
    """A trial scheduler paused it at some point (the mark stays, None once resumed)."""
    return PAUSED in trial.system_attrs


def shown(trial: Any) -> str:
    """The state a table shows: PAUSED for a paused or put-back trial, else Optuna's state."""
    return "PAUSED" if is_paused(trial) else optuna_state(trial)


def chain_root(trial: Any) -> int:
    """The first attempt of the trial's retry chain (itself when it is no retry copy): a copy is the
    same configuration at the same place in a trial scheduler's schedule as the attempt it continues."""
    return int((trial.system_attrs.get(RETRY_HISTORY) or [trial.number])[0])


# ---------------------------------------------------------------- the transitions (study/state/lifecycle.py makes them)

NEW = "new"  # a trial not in Optuna yet
# The study kinds, by trial scheduler: "plain" has none. An experiment's own loop and the built-in routine
# pass the same transitions (the kill-point harness runs "plain" with each).
ALL = ("plain", "asha", "pbt")
SCHEDULED = ("asha", "pbt")


@dataclass(frozen=True)
class Transition:
    name: str
    source: tuple[str, ...]  # the states it starts from (State values; NEW: not in Optuna yet)
    target: tuple[str, ...]  # the states it ends in
    writes: str  # what it writes, in order
    studies: tuple[str, ...] = ALL  # the study kinds whose single driver passes it (the kill-point harness runs these)


S = State
TRANSITIONS: tuple[Transition, ...] = (
    Transition("claim", (NEW, S.WAITING), (S.CLAIMED,),
               "Optuna, under the budget lock: ask() (a WAITING trial first; when the claim's read has none, a new "
               "trial without Optuna's look for one), its owner record, a heartbeat"),
    Transition("reclaim", (S.CLAIMED,), (S.CLAIMED,),
               "Optuna, under the budget lock: a dead driver's claimed trial (no run made) gets this driver's owner record"),
    Transition("release", (S.CLAIMED,), (S.RELEASED,),
               "Optuna: hpolab.released, then FAIL (the budget was full: another worker's claim came first, or budget.epochs is spent)",
               ()),
    Transition("run_created", (S.CLAIMED,), (S.RUNNING,),
               "MLflow: run trial-<n> with its tags; Optuna: user attr mlflow_run_id; MLflow: its params (config.yaml queued)"),
    Transition("segment_started", (S.RUNNING,), (S.RUNNING,),
               "Optuna (a trial scheduler's): where this segment pauses (hpolab.segment_until); its trial process (forked and set up meanwhile) told to train"),
    Transition("pause", (S.RUNNING,), (S.PAUSED,),
               "MLflow: epochs and checkpoint uploaded, tags hpolab.state=PAUSED, hpolab.rung; Optuna: hpolab.rung, "
               "hpolab.paused {rung, epoch}, an owner record without a process", SCHEDULED),
    Transition("continued", (S.RUNNING,), (S.RUNNING,),
               "Optuna, under the budget lock, at a pause point where the scheduler names the trial as the next to resume: "
               "hpolab.rung, hpolab.segment_after, hpolab.segment_until; its process told to go on (no pause, no new process); "
               "MLflow (upload thread): tags hpolab.rung and the scheduler's", ("asha",)),
    Transition("boundary_decided", (S.PAUSED,), (S.PAUSED,),
               "files (PBT): each member paused at the boundary keeps its checkpoints as pbt_epoch_<t>.pt", ("pbt",)),
    Transition("exploit_copied", (S.PAUSED,), (S.PAUSED,),
               "files (PBT): the donor's boundary checkpoints copied over the member's last.pt and best.pt", ("pbt",)),
    Transition("resume_claimed", (S.PAUSED, S.PUT_BACK), (S.RUNNING,),
               "Optuna, under the budget lock: owner record, paused mark cleared, hpolab.segment_after, the scheduler's "
               "config changes and records", SCHEDULED),
    Transition("given_back", (S.RUNNING,), (S.PAUSED, S.PUT_BACK),
               "Optuna: a paused trial claimed when a stop signal came, before its segment started: its paused mark and "
               "owner record as they were (reached by a signal, not by a kill: tests/test_stop_signals.py)", ()),
    Transition("resumed", (S.RUNNING,), (S.RUNNING,),
               "MLflow: tags hpolab.state=RUNNING, hpolab.resumed_after_epoch; a trial process from the checkpoint", SCHEDULED),
    Transition("put_back", (S.RUNNING,), (S.PUT_BACK, S.PAUSED),
               "a dead driver's segment (its checkpoint read first, outside the lock); under the budget lock: MLflow: the epochs "
               "up to its checkpoint restored, tags PAUSED; Optuna: reports restored, hpolab.interrupts + 1, hpolab.paused",
               SCHEDULED),
    Transition("told", (S.RUNNING,), (S.COMPLETE, S.PRUNED, S.FAILED),
               "Optuna: tell, then read back (its state is the truth the run records)"),
    Transition("retry_queued", (S.FAILED,), (S.RETRIED,),
               "Optuna: a WAITING copy with the same params, retry_history and the attrs it carries", ("plain",)),
    Transition("run_closed", (S.COMPLETE, S.PRUNED, S.FAILED), (S.COMPLETE, S.PRUNED, S.FAILED),
               "MLflow (upload thread, after its epochs, checkpoints and model): tags hpolab.state, status FINISHED/KILLED/FAILED"),
    Transition("reaped", (S.RUNNING,), (S.FAILED,),
               "a dead driver's trial: Optuna: hpolab.reaped, FAIL, a retry copy; MLflow: unwritten epochs restored, run closed FAILED",
               ("plain",)),
    Transition("ended_paused", (S.PAUSED, S.PUT_BACK), (S.PRUNED, S.COMPLETE),
               "nothing can run any more: Optuna: tell (PRUNED at its rung); MLflow: run closed with the rung", ("asha",)),
    Transition("imported", (NEW,), (S.IMPORTED,),
               "Optuna (a warm start): the source study's finished trials added, marked hpolab.imported_from", ()),
)
BY_NAME = {t.name: t for t in TRANSITIONS}


def diagram() -> str:
    """The transitions as text: what docs/architecture.md shows (tests/test_kill_points.py compares them)."""
    lines = []
    for t in TRANSITIONS:
        src = " | ".join(s.value if isinstance(s, State) else s for s in t.source)
        dst = " | ".join(s.value if isinstance(s, State) else s for s in t.target)
        kinds = ", ".join(t.studies) if t.studies else "none: not enumerated (see its text)"
        lines += [f"{t.name:17} {src} -> {dst}", f"{'':17} {t.writes}", f"{'':17} kill points in: {kinds}"]
    return "\n".join(lines)
