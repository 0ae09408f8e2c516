"""Pause and resume: the driver's side of a trial scheduler (study/objectives/trial_scheduler.py).

The states (paused, put back) and the transitions' writes are the trial lifecycle's
(stores/trial_states.py, study/state/lifecycle.py); this module decides when they happen.

    pause   the driver answers "stop" after the epoch the scheduler chose; the child writes last.pt
            (the pause epoch's) and ends as a stopped trial. lifecycle.pause: its run keeps open,
            tagged PAUSED, its checkpoint uploaded; its Optuna trial stays RUNNING (Optuna has no
            paused state) with the paused mark and an owner record without a process (nobody to
            wait for, no heartbeat to miss: the reaper, `study check` and repair leave it alone).
            No model is logged.
    resume  under the study's budget lock the scheduler picks a paused trial, which becomes this
            driver's before the lock is let go (lifecycle.claim_paused: two workers never resume the
            same trial). A new trial process resumes it from its checkpoint in the same Optuna trial
            and MLflow run (lifecycle.resumed): its epochs continue the step axis (nothing logged twice).
    go on   a segment at its pause point that the claim right after its pause would resume anyway (the
            scheduler's next resume, decided the same way under the lock) goes on in its process:
            lifecycle.continued records the rung and the next segment, and the driver answers
            "continue" (no checkpoint wait, no pause and resume writes, no new process). Schedulers
            whose next_resume only reads say so (goes_on_when_next: ASHA; PBT keeps files there).
    end     nothing runs anywhere, nothing can be resumed and no new trial may start: the trials
            still paused end as the scheduler says (ASHA: PRUNED, tagged with the rung reached).

A Ctrl-C or SIGTERM stop is not a pause (events.py: FAIL and a retry copy, as always).

    put back  a segment whose driver died (heartbeat.py's reaper: its owner gone, or its heartbeats
            stale) is no FAIL and gets no retry copy (lifecycle.put_back): the same trial becomes
            paused again, at the epoch of its newest checkpoint (last.pt, local else uploaded), marked
            interrupted, its run still open (tagged hpolab.interrupted_at_epoch). next_resume takes it
            first and it trains on to the pause point its segment was heading for. The epochs after the
            checkpoint that the dead segment had already logged keep the dead segment's values
            (MLflow: the resumed segment skips steps the run has; Optuna keeps a step's first report).
            A segment that had reached its pause point is simply paused there. After max_interrupts of
            one trial, the reaper fails it as any other trial.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpolab.stores.artifacts import fetch_checkpoint
from hpolab.stores.budget_lock import budget_lock
from hpolab.stores.trial_counts import last_reported
from hpolab.stores.trial_states import OWNED, PAUSED_STATES, seen_paused, states
from hpolab.study.objectives.trial_scheduler import CHANGES_ATTR, RUNG_ATTR, Resume, TrialScheduler, paused_at
from hpolab.study.state import lifecycle
from hpolab.study.state.budget import epoch_budget_spent
from hpolab.study.state.retry import OVERRIDES
from hpolab.study.trials.runner import Running

THREADS_ATTR = "hpolab.torch_threads"  # trial system attr: its first segment's torch threads (the run's tag)


@dataclass
class Claimed:
    """A paused trial this driver claimed under the lock: what to resume, and from which epoch."""

    resume: Resume
    epoch: int  # the epoch it paused after (its checkpoint's)
    trial: FrozenTrial
    logged: int = 0  # an interrupted segment's: the last epoch its run has (not logged again)


def epochs_in_flight(scheduler: TrialScheduler, trials: list[FrozenTrial]) -> int:
    """Epochs the segments training now (on any worker) will still train: each runs to the rung the
    scheduler pauses it at, else to the top. budget.epochs counts them before another segment starts,
    so parallel slots do not each spend the budget's last epochs."""
    out = 0
    for t, state in states(trials):
        if state not in OWNED:  # (a claimed one trains from its start too)
            continue
        last = last_reported(t)
        target = scheduler.pause_epoch(t, last + 1) or int(scheduler.top_epochs())
        out += max(0, target - last)
    return out


def plain_resume_of(res: Resume | None, number: int) -> bool:
    """`res` resumes trial `number` from its own checkpoint, changing nothing: it may go on in its process."""
    return (res is not None and res.number == number and not (res.config_changes or res.attrs or res.params)
            and res.source is None)


def set_dotted(config: dict[str, Any], changes: dict[str, Any]) -> None:
    """Apply `section.key` -> value changes over a resolved config."""
    for path, value in changes.items():
        section, key = path.split(".", 1)
        config.setdefault(section, {})[key] = value


class Pauses:
    """Pauses, resumes and the end of paused trials for one driver (the driver and events.py call it)."""

    def __init__(self, scheduler: TrialScheduler, spec, stores, study: optuna.Study, storage, running: dict[int, Running],
                 tracker, progress, guard: Callable[..., Any], may_resume: Callable[[], bool] = lambda: True):
        self.scheduler, self.spec, self.stores = scheduler, spec, stores
        self.study, self.storage, self.running = study, storage, running
        self.tracker, self.progress, self.note, self.guard = tracker, progress, progress.note, guard
        self.may_resume = may_resume  # whether this driver's claims may resume a trial now (no stop, drain or `study pause`)
        self.pause_at: dict[int, int | None] = {}  # trial number -> the epoch its current segment pauses after
        self.until_of: dict[int, dict[str, int] | None] = {}  # trial number -> {epoch, rung} of that pause (lifecycle.SEGMENT_UNTIL)
        self.seen: list[FrozenTrial] = []  # the study's trials as this driver's last read under the lock had them (go_on's first look)

    @property
    def runs(self) -> lifecycle.RunSide:
        """The MLflow side of a put-back and of an end (the tracker's client and writes)."""
        t, stores, name = self.tracker, self.stores, self.spec.name
        return lifecycle.RunSide(t.client, stores.tracking_uri, lambda n: stores.trial_dir(name, n), self.spec.metric,
                                 lambda run_id, tags: t.mlflow_guard(t.set_tags, run_id, tags), t.close_run, self.note)

    # ------------------------------------------------------------ configs and plans

    def adjust(self, config: dict[str, Any], user_attrs: dict[str, Any]) -> None:
        """A trial's config: trainer.max_epochs is the top rung (its LR schedule spans the whole
        training), then the config changes recorded on it so far (a retry copy carries them)."""
        config["trainer"]["max_epochs"] = int(self.scheduler.top_epochs())
        set_dotted(config, user_attrs.get(CHANGES_ATTR) or {})

    def plan(self, r: Running) -> None:
        """Where the segment `r` starts now (at epoch r.epoch + 1) pauses, and its torch threads: a
        trial's first segment records its count, its later ones (on any worker) train with that count,
        up to the CPUs there, as its run's `hpolab.torch_threads` says (reproduce replays it)."""
        frozen = self.guard(self.storage.get_trial, r.trial._trial_id)
        at = self.pause_at[r.number] = self.scheduler.pause_epoch(frozen, r.epoch + 1)
        self.until_of[r.number] = None if at is None else {"epoch": at, "rung": self._rung_of(frozen, at)}
        recorded = frozen.system_attrs.get(THREADS_ATTR)
        if recorded is not None:
            r.threads = int(recorded)  # (the runner caps it at the CPUs here)
        elif r.threads is not None:
            self.guard(self.storage.set_trial_system_attr, r.trial._trial_id, THREADS_ATTR, r.threads)

    def spawn(self, r: Running, runner, checkpoint: str | None) -> None:
        """Start `r`'s segment (lifecycle.segment_started): where it pauses is recorded first."""
        lifecycle.segment_started(lambda: runner.spawn_trial(r, checkpoint, self.running.values()), self.storage,
                                  r.trial._trial_id, self.until_of.get(r.number), self.guard)

    def stop_here(self, r: Running, epoch: int) -> bool:
        at = self.pause_at.get(r.number)
        return at is not None and epoch >= at

    def pausing(self, r: Running, info: dict[str, Any]) -> bool:
        """The trial's "done" is the pause it was asked for (not a Ctrl-C, not its own early stop)."""
        at = self.pause_at.get(r.number)
        return at is not None and info.get("stop_reason") == "stopped_by_caller" and int(info["epochs_run"]) >= at

    def read(self, r: Running) -> FrozenTrial:
        """The trial as stored now: one read for the steps of its pause (never_finite, pause)."""
        return self.guard(self.storage.get_trial, r.trial._trial_id)

    def never_finite(self, r: Running, frozen: FrozenTrial) -> bool:
        """At its pause point with no finite value of the study metric yet, under a scheduler that fails
        such a trial there (ASHA: it has nothing to rank it by; PBT ranks it worst and it exploits)."""
        if not getattr(self.scheduler, "fails_never_finite", False):
            return False
        values = frozen.intermediate_values.values()
        if any(math.isfinite(v) for v in values):
            return False
        self.pause_at.pop(r.number, None)
        self.until_of.pop(r.number, None)
        return True

    # ------------------------------------------------------------ go on, or pause

    def go_on(self, r: Running, epoch: int, value: float | None, reply: Callable[[], None]) -> bool:
        """At its pause point (its value there reported): the segment goes on in its process when the
        claim right after its pause would resume it anyway. The claim's decision, made as the claim
        makes it: under the budget lock, on one read, with this trial seen paused at `epoch` (the
        epoch budget, then the scheduler's next_resume); only a plain resume (no config changes, records
        or other weights) goes on. Recorded (lifecycle.continued) before `reply` tells the process; no
        checkpoint wait, no pause and resume writes, no new process. False: it pauses as always.
        Most trials at a rung are not promoted there: a first look at this driver's last read lets
        those pause without the lock or a read of their own (_may_be_next)."""
        if value is None or not math.isfinite(value) or not self._may_be_next(r, epoch, value):
            return False  # (not finite at its rung: it pauses, and the claims decide as always)
        with budget_lock(self.storage, self.spec.name):
            if not self.may_resume():  # (as the loop claims nothing then)
                return False
            trials = self.seen = self.guard(self.study.get_trials, deepcopy=False)
            me = trials[r.number]
            rung = self._rung_of(me, epoch)
            view = [seen_paused(t, rung, epoch) if t.number == r.number else t for t in trials]
            if epoch_budget_spent(view, self.spec, epochs_in_flight(self.scheduler, view)):
                return False
            res = self.scheduler.next_resume(view)
            if not plain_resume_of(res, r.number):
                return False
            at = self.scheduler.pause_epoch(me, epoch + 1)
            until = None if at is None else {"epoch": at, "rung": self._rung_of(me, at)}
            lifecycle.continued(self.storage, r.trial._trial_id, rung, epoch, until, reply, self.guard)
        self.pause_at[r.number], self.until_of[r.number] = at, until
        self.tracker.set_tags_later(r, {"hpolab.rung": str(rung), **res.tags})
        self.progress.trial_promoted(r.number, rung, epoch)
        return True

    def _may_be_next(self, r: Running, epoch: int, value: float) -> bool:
        """go_on's first look, without the lock or a read: whether the scheduler names the trial on the
        trials of this driver's last read, with its `value` at `epoch`. A stale read may miss a
        promotion (the trial then pauses and is resumed as always), never make one: a yes is decided
        again under the lock on a fresh read. True when the last read does not have the trial yet."""
        if r.number >= len(self.seen):
            return True
        me = copy.copy(self.seen[r.number])
        me.intermediate_values = {**me.intermediate_values, epoch: value}
        view = [seen_paused(me, self._rung_of(me, epoch), epoch) if t.number == r.number else t for t in self.seen]
        return plain_resume_of(self.scheduler.next_resume(view), r.number)

    # ------------------------------------------------------------ pause

    def pause(self, r: Running, info: dict[str, Any], frozen: FrozenTrial) -> None:
        epoch = int(info["epochs_run"])
        self.running.pop(r.number, None)  # (no more heartbeats: a paused trial has no process)
        self.pause_at.pop(r.number, None)
        self.until_of.pop(r.number, None)
        rung = self._rung_of(frozen, epoch)
        # Its run first, then the paused mark in Optuna (from then on any worker may resume it). A driver
        # killed in between leaves a RUNNING trial of a dead owner: put back as paused at its pause point.
        lifecycle.pause(self.storage, r.trial._trial_id, r.number, rung, epoch, lambda tags: self.tracker.pause(r, tags), self.guard)
        self.progress.trial_paused(r.number, rung, epoch)

    def completed(self, r: Running) -> dict[str, str]:
        """A trial that completes at the top rung: hpolab.rung says that rung (not the last it paused at)."""
        frozen = self.guard(self.storage.get_trial, r.trial._trial_id)
        k = self.scheduler.rung_index(frozen, r.epoch)
        if k is None:  # (its own early stop ended it between rungs: the last rung it paused at stays)
            return {}
        self.guard(self.storage.set_trial_user_attr, r.trial._trial_id, RUNG_ATTR, int(k))
        return {"hpolab.rung": str(k)}

    # ------------------------------------------------------------ resume

    def claim(self, trials: list[FrozenTrial]) -> Claimed | None:
        """Under the budget lock: the paused trial to resume now, owned by this driver from here on."""
        res = self.scheduler.next_resume(trials)
        if res is None:
            return None
        t = trials[res.number]
        info = paused_at(t)
        if info is None:  # (a scheduler must only name paused trials)
            return None
        lifecycle.claim_paused(self.storage, t, res.config_changes, res.attrs, self.guard)
        return Claimed(res, int(info["epoch"]), t, int(info.get("logged", 0)))

    def may_start_new(self, trials: list[FrozenTrial]) -> bool:
        return self.scheduler.may_start_new(trials)

    def in_flight(self, trials: list[FrozenTrial]) -> int:
        self.seen = trials  # (the claim's read under the lock: go_on's first look uses it)
        return epochs_in_flight(self.scheduler, trials)

    def start(self, c: Claimed, experiment, runner) -> None:
        """Resume a claimed trial in a new process, in its own Optuna trial and MLflow run."""
        t, res = c.trial, c.resume
        changes = {**(t.user_attrs.get(CHANGES_ATTR) or {}), **res.config_changes}  # (claim() recorded them)
        config = self.spec.resolved_config(experiment, t.params)
        config["trainer"].update(t.system_attrs.get(OVERRIDES) or {})  # e.g. the halved micro-batch after an OOM
        self.adjust(config, {CHANGES_ATTR: changes})
        run_id = t.user_attrs["mlflow_run_id"]
        trial_dir = self.stores.trial_dir(self.spec.name, t.number)
        trial_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = self._checkpoint(res.checkpoint, run_id, trial_dir)
        r = Running(trial=optuna.Trial(self.study, t._trial_id), run_id=run_id, config=config, trial_dir=trial_dir)
        r.epoch = r.uploaded_epoch = c.epoch
        r.last_value = t.intermediate_values.get(c.epoch)
        self.running[t.number] = r
        recorded = t.system_attrs.get(THREADS_ATTR)  # (as plan() reads it again: the claim's read has it)
        r.threads = None if recorded is None else int(recorded)
        resume_from = str(checkpoint) if checkpoint else None
        runner.prepare(r, resume_from, self.running.values())  # (set up while its start is recorded)
        tags = {"hpolab.state": "RUNNING", "hpolab.resumed_after_epoch": str(c.epoch), **res.tags}
        try:
            self.plan(r)
            lifecycle.resumed(lambda: self.tracker.resume(r, tags, res.params, logged=c.logged),
                              lambda: self.spawn(r, runner, resume_from))
        finally:
            runner.discard(r)  # (a start that did not happen; a no-op once started)
        self.progress.trial_resumed(t.number, c.epoch, (res.source if checkpoint else None) or checkpoint or "scratch")

    def _checkpoint(self, path: Path, run_id: str, trial_dir: Path) -> Path | None:
        """The checkpoint to resume from: local, else the one uploaded to its run (another worker paused it)."""
        if Path(path).is_file():
            return Path(path)
        fetched = self.guard(fetch_checkpoint, self.stores.tracking_uri, run_id, trial_dir / "fetched")
        if fetched is None:
            self.note(f"no checkpoint at {path} nor in run {run_id}: the trial starts over")
        return fetched

    # ------------------------------------------------------------ put back (a dead driver's segment)

    def put_back(self, t: FrozenTrial, reason: str) -> bool:
        """The reaper's dead trial `t` becomes paused again in the same trial and run (lifecycle.put_back).
        False: the reaper fails it as always (max_interrupts reached)."""
        if int(t.system_attrs.get(lifecycle.INTERRUPTS, 0)) >= self.spec.max_interrupts:
            return False
        target = self.scheduler.pause_epoch(t, int(t.system_attrs.get(lifecycle.SEGMENT_AFTER, 0)) + 1)
        until = None if target is None else {"epoch": target, "rung": self._rung_of(t, target)}  # (a trial that did not record it)
        info = lifecycle.put_back(self.storage, self.spec.name, t, reason, self.spec.max_interrupts, self.runs, self.guard, until)
        if info is None:
            return False
        if info:
            self.note(f"trial {t.number}: {reason}; paused again after epoch {info['epoch']} (its newest checkpoint), "
                      "in the same trial and run")
        return True

    def _rung_of(self, t: FrozenTrial, epoch: int) -> int:
        """The scheduler's rung of `epoch`, else the one after the highest the trial reached."""
        k = self.scheduler.rung_index(t, epoch)
        return int(k) if k is not None else int(t.user_attrs.get(RUNG_ATTR, -1)) + 1

    # ------------------------------------------------------------ end

    def end_paused(self, draining: bool) -> bool:
        """With nothing of this driver's running: end the trials still paused if nothing can run any
        more anywhere. False: something can still run (the loop goes on)."""
        with budget_lock(self.storage, self.spec.name):
            trials = self.guard(self.study.get_trials, deepcopy=False)
            now = states(trials)
            if any(state in OWNED for _, state in now):
                return False  # (WAITING ones are the loop's: it runs them while n_trials allows)
            spent = epoch_budget_spent(trials, self.spec)
            if not (draining or spent) and self.scheduler.next_resume(trials) is not None:
                return False
            if draining and not spent:
                return True  # a timeout or a stop rule: paused trials stay resumable by a re-run
            paused = [t for t, state in now if state in PAUSED_STATES]
            for number, state, tags in self.scheduler.at_end(paused) if paused else []:
                t = trials[number]
                if lifecycle.end_paused(self.study, t, TrialState[state], tags, self.runs, self.guard):
                    info = paused_at(t) or {}
                    why, where = END_REASONS.get(tags.get("hpolab.stop_reason"), ("nothing could resume it", "rung"))
                    self.note(f"trial {t.number} {state} at {where} {info.get('rung')} (epoch {info.get('epoch')}): {why}")
        return True


END_REASONS = {"asha_not_promoted": ("never promoted", "rung"),  # (why, what the scheduler's pause points are called)
               "pbt_not_resumed": ("not resumed (the epoch budget was spent, or a member never reached the boundary)", "boundary")}
