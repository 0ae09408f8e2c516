"""This driver's side of `hpolab study pause | resume | stop [--now] | set` (the record: stores/control.py).

The driver's loop calls `hold()` once per turn (it turns at least once a second while trials run);
the study's control record is read at most every POLL_S seconds, and a new version is applied at
once: every live driver of the study, on any host and through any storage, applies a change within
a few seconds, prints one line saying what it did, and records that it applied it (`study status`
shows who did). A driver that starts later applies the record as it finds it (a paused study starts
nothing; a stopped one runs no trial).

    pause       start no new trial and resume no paused one; running trials go on
    resume      start trials again
    stop        drain: start nothing new, running trials finish, then the driver exits 0
    stop --now  as the first Ctrl-C: running trials stop after their current epoch and resume on the
                next run (after `study resume`); the driver exits 0
    set k=v     the run controls (config/run_controls.py), validated against this driver's spec

A stop is final for the drivers that applied it (a `resume` afterwards lets new drivers run).
"""

from __future__ import annotations

import os
import time
from typing import Any

from hpolab.config.run_controls import value_at, with_controls
from hpolab.errors import SpecError
from hpolab.stores.control import Control, applied_key, now_iso, read_control
from hpolab.study.state.budget import may_start_another, trial_counts
from hpolab.study.state.owners import this_host

POLL_S = 1.0  # seconds between reads of the control record while the loop turns
BUDGET_ATTR = "hpolab.budget_epochs"  # the study user attr `study status` shows the epoch budget from


class StudyControl:
    """The control as this driver applied it. Acts on the driver: its spec, its draining flag, its signals."""

    def __init__(self, driver):
        self.driver = driver
        self.version = 0
        self.state = "running"  # as last applied
        self.paused = False
        self.halted: str | None = None  # why a stop ended this driver's study (the Outcome's)
        self.worker = f"{this_host()} pid {os.getpid()}"
        self._key = applied_key(this_host(), os.getpid())
        self._next = 0.0
        self.poll(force=True)  # a driver joining a paused, stopped or changed study applies it first

    def hold(self) -> bool:
        """Once per loop turn. True when the study is paused and this driver runs nothing: it waited
        a moment here and the loop goes round again (it leaves only on resume, a stop, a signal or its timeout)."""
        self.poll()
        d = self.driver
        if self.paused and not d.running and not (d.signals.stopping or d.draining) and not self._study_done():
            time.sleep(POLL_S)
            return True
        return False

    def _study_done(self) -> bool:
        """Nothing is left to run (n_trials finished, none waiting): a paused driver need not wait."""
        counts = self.driver.outage.call(trial_counts, self.driver.study)
        return not counts["waiting"] and not may_start_another(counts, self.driver.spec.n_trials)

    def poll(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + POLL_S
        d = self.driver
        control = d.outage.call(read_control, d.storage, d.study._study_id)
        if control.version != self.version:
            self._apply(control)

    def _apply(self, c: Control) -> None:
        d = self.driver
        done = [self._set(c.values)] if c.values else []
        changed = c.state != self.state
        self.paused, self.state = c.state == "paused", c.state
        if not changed:
            pass  # (a `set`: the state stays as it was)
        elif c.state == "stopped" and self.halted is None:
            self.halted = f"stopped by {c.by} ({c.change}, control v{c.version})"
            if not self.version:  # it was stopped before this driver started
                d.draining = True
                done.append(f"the study is stopped: starting no trial (`hpolab study resume {d.spec.name}` lets it run again)")
            elif c.stop == "now":
                d.signals.stopping = True  # (what the first Ctrl-C sets: events.py stops each trial after its epoch)
                done.append(f"stopping now: running trials ({len(d.running)}) stop after their current epoch, resumable")
            else:
                d.draining = True
                done.append(f"stopping: no new trials; running trials ({len(d.running)}) finish, then this worker exits")
        elif self.paused and not self.version:
            done.append(f"the study is paused: starting no trial until `hpolab study resume {d.spec.name}`")
        elif self.paused:
            done.append(f"paused: no new trials or resumes; running trials ({len(d.running)}) go on")
        elif c.state == "running":
            done.append("running: trials start again")
        what = "; ".join(x for x in done if x) or "nothing to change here"
        if self.version or what != "nothing to change here":  # (a driver starting says only what is in effect)
            d.progress.note(f"study control v{c.version} ({c.change}, by {c.by}) applied: {what}")
        self.version = c.version
        d.outage.call(d.storage.set_study_system_attr, d.study._study_id, self._key,
                      {"version": c.version, "at": now_iso(), "worker": self.worker, "did": what})

    def _set(self, values: dict[str, Any]) -> str:
        """Apply the run controls to this driver's spec; what changed ('n_trials 20 -> 60'), or why not."""
        d = self.driver
        try:
            spec = with_controls(d.spec, values)
        except SpecError as e:
            return f"run controls not applied here ({'; '.join(e.problems)})"
        changed = [f"{k} {value_at(d.spec, k)} -> {value_at(spec, k)}" for k in values if value_at(d.spec, k) != value_at(spec, k)]
        if not changed:
            return ""
        apply_spec(d, spec)
        if "budget.epochs" in values:
            d.outage.call(d.study.set_user_attr, BUDGET_ATTR, spec.budget.epochs)
        return "set " + ", ".join(changed)


def apply_spec(d, spec) -> None:
    """Every part of the driver that holds the spec gets the new one (run controls only differ)."""
    d.spec = d.progress.spec = d.events.spec = d.no_improvement.spec = spec
    if d.pauses:
        d.pauses.spec = spec
    d.streak.max_failures = spec.max_failures
    d.runner.parallel = d.runner.host_slots.parallel = spec.parallel  # (the torch threads of trials started from now)
