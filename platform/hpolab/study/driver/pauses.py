"""Pause and resume: the driver's side of a trial scheduler (study/objectives/trial_scheduler.py).

    pause   the driver answers "stop" after the epoch the scheduler chose; the child writes last.pt
            (the pause epoch's) and ends as a stopped trial. Its Optuna trial stays RUNNING (Optuna
            has no paused state) with system attr hpolab.paused = {rung, epoch}, user attr
            hpolab.rung, and an owner record without a process (owners.py: nobody to wait for, no
            heartbeat to miss: the reaper, `study check` and repair leave it alone). Its MLflow run
            stays open, tagged hpolab.state=PAUSED and hpolab.rung; no model is logged.
    resume  under the study's budget lock the scheduler picks a paused trial, whose owner record
            becomes this driver before the lock is let go (two workers never resume the same
            trial). A new trial process resumes it from its checkpoint in the same Optuna trial and
            MLflow run: its epochs continue the step axis (nothing logged twice).
    end     nothing runs anywhere, nothing can be resumed and no new trial may start: the trials
            still paused end as the scheduler says (ASHA: PRUNED, tagged with the rung reached).

A Ctrl-C or SIGTERM stop is not a pause (events.py: FAIL and a retry copy, as always).

    put back  a segment whose driver died (heartbeat.py's reaper: its owner gone, or its heartbeats
            stale) is no FAIL and gets no retry copy: the same trial becomes paused again, at the epoch
            of its newest checkpoint (last.pt, local else uploaded), hpolab.paused = {rung, epoch,
            "interrupted": True}, its run still open (tagged hpolab.interrupted_at_epoch). next_resume
            takes it first and it trains on to the pause point its segment was heading for. The epochs
            after the checkpoint that the dead segment had already logged keep the dead segment's values
            (MLflow: the resumed segment skips steps the run has; Optuna keeps a step's first report).
            A segment that had reached its pause point is simply paused there. After max_interrupts of
            one trial, the reaper fails it as any other trial.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpolab.stores.artifacts import fetch_checkpoint
from hpolab.stores.budget_lock import budget_lock
from hpolab.stores.trial_counts import last_reported
from hpolab.study.objectives.trial_scheduler import (CHANGES_ATTR, INTERRUPTS_ATTR, PAUSED_ATTR, RUNG_ATTR, SEGMENT_ATTR, Resume,
                                                      TrialScheduler, paused_at)
from hpolab.study.state.budget import epoch_budget_spent
from hpolab.study.state.metric_backfill import backfill_and_last_step, checkpoint_history
from hpolab.study.state.owners import OWNER_ATTR, owner_of, owner_record
from hpolab.study.state.retry import OVERRIDES
from hpolab.study.trials.runner import Running

PAUSED_OWNER = "paused"  # the owner record of a paused trial: {"trial": n, "paused": True} (no process)
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
    for t in trials:
        if t.state != TrialState.RUNNING or paused_at(t) is not None:
            continue
        last = last_reported(t)
        target = scheduler.pause_epoch(t, last + 1) or int(scheduler.top_epochs())
        out += max(0, target - last)
    return out


def set_dotted(config: dict[str, Any], changes: dict[str, Any]) -> None:
    """Apply `section.key` -> value changes over a resolved config."""
    for path, value in changes.items():
        section, key = path.split(".", 1)
        config.setdefault(section, {})[key] = value


class Pauses:
    """Pauses, resumes and the end of paused trials for one driver (the driver and events.py call it)."""

    def __init__(self, scheduler: TrialScheduler, spec, stores, study: optuna.Study, storage, running: dict[int, Running],
                 tracker, progress, guard: Callable[..., Any]):
        self.scheduler, self.spec, self.stores = scheduler, spec, stores
        self.study, self.storage, self.running = study, storage, running
        self.tracker, self.progress, self.note, self.guard = tracker, progress, progress.note, guard
        self.pause_at: dict[int, int | None] = {}  # trial number -> the epoch its current segment pauses after

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
        self.pause_at[r.number] = self.scheduler.pause_epoch(frozen, r.epoch + 1)
        recorded = frozen.system_attrs.get(THREADS_ATTR)
        if recorded is not None:
            r.threads = int(recorded)  # (the runner caps it at the CPUs here)
        elif r.threads is not None:
            self.guard(self.storage.set_trial_system_attr, r.trial._trial_id, THREADS_ATTR, r.threads)

    def stop_here(self, r: Running, epoch: int) -> bool:
        at = self.pause_at.get(r.number)
        return at is not None and epoch >= at

    def pausing(self, r: Running, info: dict[str, Any]) -> bool:
        """The trial's "done" is the pause it was asked for (not a Ctrl-C, not its own early stop)."""
        at = self.pause_at.get(r.number)
        return at is not None and info.get("stop_reason") == "stopped_by_caller" and int(info["epochs_run"]) >= at

    # ------------------------------------------------------------ pause

    def pause(self, r: Running, info: dict[str, Any]) -> None:
        epoch = int(info["epochs_run"])
        self.running.pop(r.number, None)  # (no more heartbeats: a paused trial has no process)
        self.pause_at.pop(r.number, None)
        g, tid = self.guard, r.trial._trial_id
        rung = self._rung(r, epoch)
        # Its run first, then the paused mark in Optuna (from then on any worker may resume it). A driver
        # killed in between leaves a RUNNING trial of a dead owner: reaped and retried as always.
        self.tracker.pause(r, {"hpolab.state": "PAUSED", "hpolab.rung": str(rung), "hpolab.paused_at_epoch": str(epoch)})
        g(self.storage.set_trial_user_attr, tid, RUNG_ATTR, rung)
        g(self.storage.set_trial_system_attr, tid, PAUSED_ATTR, {"rung": rung, "epoch": epoch})
        g(self.storage.set_trial_user_attr, tid, OWNER_ATTR, {"trial": r.number, PAUSED_OWNER: True})
        self.progress.trial_paused(r.number, rung, epoch)

    def completed(self, r: Running) -> dict[str, str]:
        """A trial that completes at the top rung: hpolab.rung says that rung (not the last it paused at)."""
        frozen = self.guard(self.storage.get_trial, r.trial._trial_id)
        k = self.scheduler.rung_index(frozen, r.epoch)
        if k is None:  # (its own early stop ended it between rungs: the last rung it paused at stays)
            return {}
        self.guard(self.storage.set_trial_user_attr, r.trial._trial_id, RUNG_ATTR, int(k))
        return {"hpolab.rung": str(k)}

    def _rung(self, r: Running, epoch: int) -> int:
        return self._rung_of(self.guard(self.storage.get_trial, r.trial._trial_id), epoch)

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
        g = self.guard
        g(self.storage.set_trial_user_attr, t._trial_id, OWNER_ATTR, owner_record(t.number))
        g(self.storage.set_trial_system_attr, t._trial_id, PAUSED_ATTR, None)
        # where this segment started: an interrupted one goes on with the segment its dead driver began
        g(self.storage.set_trial_system_attr, t._trial_id, SEGMENT_ATTR, int(info.get("after", info["epoch"])))
        if hasattr(self.storage, "record_heartbeat"):
            g(self.storage.record_heartbeat, t._trial_id)
        # The scheduler's decision is recorded here, under the lock, right after it made it (PBT copied
        # the donor's checkpoint in next_resume): a driver that dies before start() leaves a trial that
        # says what its checkpoint is, and is resumed with no new decision.
        if res.config_changes:  # a re-run rebuilds the config from the params and these
            g(self.storage.set_trial_user_attr, t._trial_id, CHANGES_ATTR, {**(t.user_attrs.get(CHANGES_ATTR) or {}), **res.config_changes})
        for key, value in res.attrs.items():  # the scheduler's records (PBT: schedule, parents)
            g(self.storage.set_trial_user_attr, t._trial_id, key, value)
        return Claimed(res, int(info["epoch"]), t, int(info.get("logged", 0)))

    def may_start_new(self, trials: list[FrozenTrial]) -> bool:
        return self.scheduler.may_start_new(trials)

    def in_flight(self, trials: list[FrozenTrial]) -> int:
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
        self.tracker.resume(r, {"hpolab.state": "RUNNING", "hpolab.resumed_after_epoch": str(c.epoch), **res.tags}, res.params,
                            logged=c.logged)
        self.running[t.number] = r
        self.plan(r)
        runner.spawn_trial(r, str(checkpoint) if checkpoint else None, self.running.values())
        self.progress.trial_resumed(t.number, c.epoch, checkpoint or "scratch")

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
        """The reaper's dead trial `t` becomes paused again in the same trial and run (the module's
        "put back"). False: the reaper fails it as always (max_interrupts reached)."""
        if int(t.system_attrs.get(INTERRUPTS_ATTR, 0)) >= self.spec.max_interrupts:
            return False
        g, tid = self.guard, t._trial_id
        with budget_lock(self.storage, self.spec.name):  # (another worker's reaper may find it dead too)
            now = g(self.storage.get_trial, tid)
            if now.state != TrialState.RUNNING or paused_at(now) is not None or owner_of(now) != owner_of(t):
                return True  # put back, claimed or ended by another worker meanwhile
            info, tags = self._put_back_mark(now, reason)
            run_id = now.user_attrs.get("mlflow_run_id")
            if run_id:  # its run first, then the mark in Optuna (from then on any worker may resume it)
                self.tracker.mlflow_guard(self.tracker.set_tags, run_id, tags)
            g(self.storage.set_trial_system_attr, tid, INTERRUPTS_ATTR, int(now.system_attrs.get(INTERRUPTS_ATTR, 0)) + 1)
            if not info.get("interrupted"):
                g(self.storage.set_trial_user_attr, tid, RUNG_ATTR, info["rung"])
            g(self.storage.set_trial_system_attr, tid, PAUSED_ATTR, info)
            g(self.storage.set_trial_user_attr, tid, OWNER_ATTR, {"trial": t.number, PAUSED_OWNER: True})
        self.note(f"trial {t.number}: {reason}; paused again after epoch {info['epoch']} (its newest checkpoint), "
                  "in the same trial and run")
        return True

    def _put_back_mark(self, t: FrozenTrial, reason: str) -> tuple[dict[str, Any], dict[str, str]]:
        """(hpolab.paused, the run's tags) for dead trial `t`: its run gets every epoch up to its newest
        checkpoint's (metric_backfill.py), Optuna the study metric's epochs it lacks up to there."""
        run_id, metric = t.user_attrs.get("mlflow_run_id"), self.spec.metric
        trial_dir = self.stores.trial_dir(self.spec.name, t.number)
        history = (self.guard(checkpoint_history, trial_dir, self.stores.tracking_uri, run_id) if run_id else None) or []
        epoch = max((int(h["epoch"]) for h in history), default=0)
        for h in history:  # (its driver died between the checkpoint and the report)
            v = h.get(metric)
            if int(h["epoch"]) not in t.intermediate_values and isinstance(v, (int, float)) and v == v:
                self.guard(self.storage.set_trial_intermediate_value, t._trial_id, int(h["epoch"]), float(v))
        t = self.guard(self.storage.get_trial, t._trial_id)
        restored, logged = {}, 0
        if run_id:
            client = self.tracker.client
            restored, logged = backfill_and_last_step(client, run_id, t, metric, trial_dir, self.stores.tracking_uri, history,
                                                      up_to=epoch, note=self.note)
            if logged is None:  # (the backfill failed, noted, or never read the metric: what the run has, read on its own)
                logged = max((m.step for m in self.tracker.mlflow_guard(client.get_metric_history, run_id, metric)), default=0)
        after = int(t.system_attrs.get(SEGMENT_ATTR, 0))
        target = self.scheduler.pause_epoch(t, after + 1)
        if target is not None and epoch >= target:  # it reached its pause point: paused there, as its driver would have
            rung = self._rung_of(t, target)
            return {"rung": rung, "epoch": target}, {"hpolab.state": "PAUSED", "hpolab.rung": str(rung),
                                                     "hpolab.paused_at_epoch": str(target), **restored}
        info = {"rung": int(t.user_attrs.get(RUNG_ATTR, -1)), "epoch": epoch, "interrupted": True, "after": after, "logged": logged}
        return info, {"hpolab.state": "PAUSED", "hpolab.interrupted_at_epoch": str(epoch), "hpolab.interrupted": reason, **restored}

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
            if any(t.state == TrialState.RUNNING and paused_at(t) is None for t in trials):
                return False  # (WAITING ones are the loop's: it runs them while n_trials allows)
            spent = epoch_budget_spent(trials, self.spec)
            if not (draining or spent) and self.scheduler.next_resume(trials) is not None:
                return False
            if draining and not spent:
                return True  # a timeout or a stop rule: paused trials stay resumable by a re-run
            paused = [t for t in trials if paused_at(t) is not None]
            for number, state, tags in self.scheduler.at_end(paused) if paused else []:
                self._end(trials[number], TrialState[state], tags)
        return True

    def _end(self, t: FrozenTrial, state: TrialState, tags: dict[str, str]) -> None:
        info = paused_at(t) or {}
        value = t.intermediate_values.get(info.get("epoch")) if state == TrialState.COMPLETE else None
        try:
            self.guard(self.study.tell, t.number, value, state=None if state == TrialState.COMPLETE else state, skip_if_finished=True)
        except Exception as e:
            self.note(f"trial {t.number}: ending it {state.name} failed: {type(e).__name__}: {e}")
            return
        run_id = t.user_attrs.get("mlflow_run_id")
        if run_id:
            self.tracker.close_run(run_id, state, {"hpolab.rung": str(info.get("rung")), **tags})
        self.note(f"trial {t.number} {state.name} at rung {info.get('rung')} (epoch {info.get('epoch')}): never promoted")
