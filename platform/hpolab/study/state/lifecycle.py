"""The trial lifecycle: the functions that move a trial between its hpolab states, writing Optuna and
MLflow together.

The states, which state a stored trial is in, and the transitions as data (TRANSITIONS: their
names, from and to which states, what they write) are stores/trial_states.py (light: `study status`
reads them without Optuna). This module moves trials between them; the driver, the reaper, the
trial scheduler's pauses and `study check --repair` call these functions and write no state mark
themselves. Each function runs its writes inside `step(name)`: a kill point before and after it.
The order of the writes inside a step is what makes a kill anywhere recoverable: the mark that
hands a trial to another driver (Optuna's) is written last, after what that driver will need
(the run, the uploaded checkpoint, the run's tags).

Kill points: with the environment variable HPOLAB_KILL_AT=<transition>:<before|after>[:<n>] a
driver SIGKILLs itself at the n-th (default: first) time it passes that point, after writing the
point to the file HPOLAB_KILL_MARK names (if any). The suite's kill-point harness
(tests/test_kill_points.py) reads TRANSITIONS and kills a driver at each point of each study kind
that passes it, re-runs at once and checks that the stores still agree. A new transition is
covered by adding it to TRANSITIONS. docs/architecture.md's state diagram is trial_states.diagram()'s text.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpolab.stores.optuna_storage import ask_new
from hpolab.stores.trial_states import BY_NAME, OWNER, PAUSED, RELEASED, RUN_ID, State, paused_mark, retried_numbers, state_of
from hpolab.study.state.outage import passthrough
from hpolab.study.state.owners import first_heartbeat, owner_of, owner_record

KILL_AT = "HPOLAB_KILL_AT"  # "<transition>:<before|after>[:<n>[:TERM]]": SIGKILL (SIGTERM) this driver there (the suite's)
KILL_MARK = "HPOLAB_KILL_MARK"  # a file the kill point is written to just before the kill
_passed: dict[str, int] = {}


def kill_point(name: str, when: str) -> None:
    """SIGKILL this process if HPOLAB_KILL_AT names this point (and this is its n-th pass)."""
    at = os.environ.get(KILL_AT)
    if not at:
        return
    parts = at.split(":")
    if parts[:2] != [name, when]:
        return
    key = f"{name}:{when}"
    _passed[key] = _passed.get(key, 0) + 1
    if _passed[key] != (int(parts[2]) if len(parts) > 2 and parts[2] else 1):
        return
    mark = os.environ.get(KILL_MARK)
    if mark:
        Path(mark).write_text(at)
    # (a 4th field TERM sends SIGTERM instead, and goes on: a stop signal at that very point)
    os.kill(os.getpid(), signal.SIGTERM if parts[3:4] == ["TERM"] else signal.SIGKILL)


@contextmanager
def step(name: str) -> Iterator[None]:
    """One transition's writes, with a kill point before and after them."""
    assert name in BY_NAME, name
    kill_point(name, "before")
    yield
    kill_point(name, "after")


# ---------------------------------------------------------------- new trials


def claim(study: optuna.Study, storage, distributions: dict, over_budget: Callable[[int], bool] | None = None,
          guard: Callable[..., Any] = passthrough, no_waiting: bool = False) -> optuna.Trial | None:
    """A new (or WAITING) trial for this driver, under the budget lock: asked, owned, one heartbeat.
    `over_budget(number)`: the optimistic check where no lock is held (True: released, None back).
    `no_waiting`: the claim's read under the lock found no WAITING trial (ask_new: no look for one)."""
    with step("claim"):
        trial = ask_new(study, distributions) if no_waiting else study.ask(fixed_distributions=distributions)
        if over_budget is not None and guard(over_budget, trial.number):
            guard(release, study, trial)  # another worker took the last slot first
            return None
        guard(trial.set_user_attr, OWNER, owner_record(trial.number))  # first: a dead owner is seen at once
        first_heartbeat(storage, trial._trial_id, guard)
    return trial


def reclaim(study: optuna.Study, storage, t: FrozenTrial, guard: Callable[..., Any] = passthrough) -> optuna.Trial | None:
    """A claimed trial whose driver died before making its run (nothing was trained or logged) goes on
    in the same Optuna trial, owned by this driver. Under the budget lock; None when it is no longer
    that dead driver's claimed trial (another worker took it)."""
    now = guard(storage.get_trial, t._trial_id)
    if state_of(now) != State.CLAIMED or owner_of(now) != owner_of(t):
        return None
    with step("reclaim"):
        guard(storage.set_trial_user_attr, t._trial_id, OWNER, owner_record(t.number))
        first_heartbeat(storage, t._trial_id, guard)
    return optuna.Trial(study, t._trial_id)


def release(study: optuna.Study, trial) -> None:
    """Give back a trial that must not run: FAIL (Optuna has no other final state), marked released
    so that it counts nowhere (budget, status) and its sampled parameters are not a result."""
    with step("release"):
        study._storage.set_trial_system_attr(trial._trial_id, RELEASED, True)
        tell_optuna(study, trial.number, None, state=TrialState.FAIL, skip_if_finished=True)


def run_created(trial: optuna.Trial, make_run: Callable[[], str], guard: Callable[..., Any] = passthrough) -> str:
    """The trial's MLflow run (`make_run`: creates it, returns its id), then its id on the Optuna trial:
    from then on the trial is running (a run made but not linked is an orphan the next driver deletes)."""
    with step("run_created"):
        run_id = make_run()
        guard(trial.set_user_attr, RUN_ID, run_id)
    return run_id


SEGMENT_UNTIL = "hpolab.segment_until"  # system attr: {"epoch": e, "rung": k} the current segment pauses at (None: the end)


def segment_started(spawn: Callable[[], None], storage=None, trial_id: int | None = None, until: dict | None = None,
                    guard: Callable[..., Any] = passthrough) -> None:
    """A trial process starts a segment. Under a trial scheduler (`storage` given) where it pauses is
    recorded first: a segment its driver dies in is put back (`put_back_mark`) without the scheduler."""
    with step("segment_started"):
        if storage is not None:
            guard(storage.set_trial_system_attr, trial_id, SEGMENT_UNTIL, until)
        spawn()


# ---------------------------------------------------------------- ends


def tell(study: optuna.Study, trial, state: TrialState, value, skip_if_finished: bool = False) -> None:
    """Tell Optuna the trial's end (the caller reads it back: Optuna's state is the truth)."""
    with step("told"):
        tell_optuna(study, trial, value if state == TrialState.COMPLETE else None,
                    state=None if state == TrialState.COMPLETE else state, skip_if_finished=skip_if_finished)


def tell_optuna(study: optuna.Study, trial, value, state: TrialState | None, skip_if_finished: bool) -> None:
    """study.tell, where a grid sampler with no grid point left is no error. Its after_trial calls
    study.stop(), which raises outside study.optimize (our driver asks and tells); Optuna has stored the
    trial's end by then (it writes it in a `finally`), and the driver decides itself when the study ends."""
    try:
        study.tell(trial, value, state=state, skip_if_finished=skip_if_finished)
    except RuntimeError as e:
        if not (isinstance(study.sampler, optuna.samplers.GridSampler) and "Study.stop" in str(e)):
            raise


def close_run(close: Callable[[str, TrialState, dict[str, str]], None], run_id: str, state: TrialState, tags: dict[str, str]) -> None:
    """The MLflow half of an end: the run closed with the state Optuna has."""
    with step("run_closed"):
        close(run_id, state, tags)


RETRY_DUE = "hpolab.retry_due"  # system attr {kind, overrides}: written before a FAIL that gets a retry copy


def owe_retry(storage, trial_id: int, kind: str, overrides: dict | None = None) -> None:
    """Before a running trial is told FAIL with a retry to follow: the FAIL and its copy are two writes,
    and a driver killed between them leaves a FAIL that owes its copy (owed_retries queues it)."""
    storage.set_trial_system_attr(trial_id, RETRY_DUE, {"kind": kind, "overrides": overrides or {}})


def queue_retry(retry, study: optuna.Study, trial: FrozenTrial, kind: str, overrides: dict | None = None) -> int | None:
    """A failed attempt's retry copy (state/retry.py's RetryCopy: once per attempt): its number, None when refused."""
    with step("retry_queued"):
        return retry(study, trial, kind=kind, overrides=overrides)


def owed(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The failed attempts that owe a retry copy (their driver died between the FAIL and the copy)."""
    retried = retried_numbers(trials)
    return [t for t in trials if t.state == TrialState.FAIL and isinstance(t.system_attrs.get(RETRY_DUE), dict)
            and t.number not in retried]


def owed_retries(study: optuna.Study, trials: list[FrozenTrial], retry, guard: Callable[..., Any] = passthrough) -> list[int]:
    """The retry copies `owed`, queued now; the copies' numbers (a copy the limits refuse is refused
    again, and never queued)."""
    out = []
    for t in owed(trials):
        due = t.system_attrs[RETRY_DUE]
        copy = guard(queue_retry, retry, study, t, due["kind"], due.get("overrides") or None)
        if copy is not None:
            out.append(copy)
    return out


REAPED = "hpolab.reaped"  # system attr of a trial another driver failed as dead: by whom, and why


def reap(study: optuna.Study, storage, t: FrozenTrial, why: tuple[str, str], retry,
         close: Callable[[str, TrialState, dict[str, str]], None], note: Callable[[str], None],
         guard: Callable[..., Any] = passthrough, by: str | None = None) -> str:
    """Fail running trial `t` of a dead driver (`why`: kind, reason): the reaped mark, FAIL, its retry
    copy, its run closed FAILED with the reason (`close` restores unwritten epochs first). What was done."""
    kind, reason = why
    me = owner_record(t.number)
    with step("reaped"):
        try:  # the marks first (a FAIL trial takes no attrs); they stay on a trial whose owner finished it first
            who = by or f"{me['host']} pid {me['pid']}"
            guard(storage.set_trial_system_attr, t._trial_id, REAPED, f"{who}: {reason}")
            guard(owe_retry, storage, t._trial_id, kind)
            if not guard(storage.set_trial_state_values, t._trial_id, state=TrialState.FAIL):
                return "it had already finished"
        except optuna.exceptions.UpdateFinishedTrialError:
            return "it had already finished"  # another driver reaped (or its owner finished) it first
        copy = guard(queue_retry, retry, study, guard(storage.get_trial, t._trial_id), kind)
        reason += f"; retried as trial {copy}" if copy is not None else f"; {retry.refusal(kind)}"
        run_id = t.user_attrs.get(RUN_ID)
        if run_id:
            tags = {"hpolab.fail_reason": reason, "hpolab.fail_kind": kind}
            if copy is not None:
                tags["hpolab.retried_as_trial"] = str(copy)
            try:
                close(run_id, TrialState.FAIL, tags)
            except Exception as e:
                note(f"could not close the MLflow run of dead trial {t.number}: {e}")
    note(f"trial {t.number} was left RUNNING: {reason}")
    return f"marked FAIL, queued to resume as trial {copy}" if copy is not None else f"marked FAIL, {retry.refusal(kind)}"


# ---------------------------------------------------------------- a trial scheduler's pauses (study/driver/pauses.py decides when)

RUNG = "hpolab.rung"  # user attr: the highest rung (0-based) the trial reached
CHANGES = "hpolab.config_changes"  # user attr: dotted config key -> value, applied over its params
SEGMENT_AFTER = "hpolab.segment_after"  # system attr: the epoch its current segment resumed after (0: none yet)
INTERRUPTS = "hpolab.interrupts"  # system attr: how often a dead driver's segment of it was put back to paused
PAUSED_OWNER = "paused"  # the owner record of a paused trial: {"trial": n, "paused": True} (no process)


def pause(storage, trial_id: int, number: int, rung: int, epoch: int, run_side: Callable[[dict[str, str]], None],
          guard: Callable[..., Any] = passthrough) -> None:
    """A segment stopped at its pause point. `run_side(tags)`: its epochs and checkpoint uploaded and
    the run tagged (the tracker's pause: it returns once they landed). Then the marks in Optuna:
    from the paused mark on, any worker may resume it (and finds its checkpoint in the run)."""
    with step("pause"):
        run_side({"hpolab.state": "PAUSED", "hpolab.rung": str(rung), "hpolab.paused_at_epoch": str(epoch)})
        guard(storage.set_trial_user_attr, trial_id, RUNG, rung)
        guard(storage.set_trial_system_attr, trial_id, PAUSED, {"rung": rung, "epoch": epoch})
        guard(storage.set_trial_user_attr, trial_id, OWNER, {"trial": number, PAUSED_OWNER: True})


def continued(storage, trial_id: int, rung: int, epoch: int, until: dict | None, go_on: Callable[[], None],
              guard: Callable[..., Any] = passthrough) -> None:
    """Under the budget lock: a segment at its pause point that the scheduler would resume next goes on
    in its process, recorded as a resumed segment is (rung reached, where the next segment starts and
    pauses); then `go_on` tells the process. Killed before: put back paused there; after: interrupted."""
    with step("continued"):
        guard(storage.set_trial_user_attr, trial_id, RUNG, rung)
        guard(storage.set_trial_system_attr, trial_id, SEGMENT_AFTER, epoch)
        guard(storage.set_trial_system_attr, trial_id, SEGMENT_UNTIL, until)
        go_on()


def claim_paused(storage, t: FrozenTrial, config_changes: dict[str, Any], attrs: dict[str, Any],
                 guard: Callable[..., Any] = passthrough) -> dict[str, Any]:
    """Under the budget lock: paused (or put back) trial `t` becomes this driver's, with the scheduler's
    decision recorded right after it was made (a driver that dies before the segment starts leaves a
    trial that says what its checkpoint is: resumed by the next one with no new decision). Its mark."""
    info = paused_mark(t)
    with step("resume_claimed"):
        guard(storage.set_trial_user_attr, t._trial_id, OWNER, owner_record(t.number))
        guard(storage.set_trial_system_attr, t._trial_id, PAUSED, None)
        # where this segment started: an interrupted one goes on with the segment its dead driver began
        guard(storage.set_trial_system_attr, t._trial_id, SEGMENT_AFTER, int(info.get("after", info["epoch"])))
        first_heartbeat(storage, t._trial_id, guard)
        if config_changes:  # a re-run rebuilds the config from the params and these
            guard(storage.set_trial_user_attr, t._trial_id, CHANGES, {**(t.user_attrs.get(CHANGES) or {}), **config_changes})
        for key, value in attrs.items():  # the scheduler's records (PBT: schedule, parents)
            guard(storage.set_trial_user_attr, t._trial_id, key, value)
    return info


def resumed(run_side: Callable[[], None], spawn: Callable[[], None]) -> None:
    """A claimed paused trial's run says RUNNING again (`run_side`), and its process starts (`spawn`)."""
    with step("resumed"):
        run_side()
        spawn()


def boundary_decided(snapshot: Callable[[], None]) -> None:
    """PBT: the members' boundary checkpoints kept (files only), before any member at it resumes."""
    with step("boundary_decided"):
        snapshot()


def exploit_copied(copy: Callable[[], None]) -> None:
    """PBT: a member's last.pt and best.pt become its donor's (files only; claim_paused records it)."""
    with step("exploit_copied"):
        copy()


def imported(add: Callable[[], None]) -> None:
    """A warm start's trials added to the study (marked hpolab.imported_from by `add`)."""
    with step("imported"):
        add()


@dataclass
class RunSide:
    """The MLflow side a put-back and an end of a paused trial need."""

    client: Any
    tracking_uri: str | None
    trial_dir: Callable[[int], Path]
    metric: str | None
    set_tags: Callable[[str, dict[str, str]], None]
    close: Callable[[str, TrialState, dict[str, str]], None]
    note: Callable[[str], None]


def put_back(storage, study_name: str, t: FrozenTrial, reason: str, max_interrupts: int, runs: RunSide,
             guard: Callable[..., Any] = passthrough, until: dict | None = None) -> dict[str, Any] | None:
    """A trial scheduler's segment whose driver died becomes paused again, in the same trial and run:
    no FAIL, no retry copy. Its checkpoint is read (maybe downloaded) before the budget lock is taken;
    under it the trial is checked to be still that dead driver's, its run gets the epochs up to the
    checkpoint (metric_backfill.py) and the tags, Optuna the missing reports and the paused mark
    (put_back_mark). `until`: where the segment pauses, for a trial that did not record it. The mark
    written ({} when another worker handled it meanwhile); None: max_interrupts reached (reap it)."""
    from hpolab.stores.budget_lock import budget_lock
    from hpolab.study.state.metric_backfill import checkpoint_history

    if int(t.system_attrs.get(INTERRUPTS, 0)) >= max_interrupts:
        return None
    run_id = t.user_attrs.get(RUN_ID)
    history = (guard(checkpoint_history, runs.trial_dir(t.number), runs.tracking_uri, run_id) if run_id else None) or []
    with budget_lock(storage, study_name):  # (another worker's reaper may find it dead too)
        now = guard(storage.get_trial, t._trial_id)
        if state_of(now) != State.RUNNING or owner_of(now) != owner_of(t):
            return {}  # put back, claimed or ended by another worker meanwhile
        with step("put_back"):
            info, tags = _put_back_mark(storage, now, history, runs, guard, until)
            if run_id:  # its run first, then the mark in Optuna (from then on any worker may resume it)
                runs.set_tags(run_id, {**tags, "hpolab.interrupted": reason} if info.get("interrupted") else tags)
            guard(storage.set_trial_system_attr, t._trial_id, INTERRUPTS, int(now.system_attrs.get(INTERRUPTS, 0)) + 1)
            if not info.get("interrupted"):
                guard(storage.set_trial_user_attr, t._trial_id, RUNG, info["rung"])
            guard(storage.set_trial_system_attr, t._trial_id, PAUSED, info)
            guard(storage.set_trial_user_attr, t._trial_id, OWNER, {"trial": t.number, PAUSED_OWNER: True})
    return info


def _put_back_mark(storage, t: FrozenTrial, history: list[dict], runs: RunSide, guard, until) -> tuple[dict, dict[str, str]]:
    """(hpolab.paused, the run's tags) for dead trial `t`: its run gets every epoch up to its newest
    checkpoint's, Optuna the study metric's epochs it lacks up to there. A segment that reached its
    pause point is paused there, as its driver would have; else it is put back (interrupted)."""
    from hpolab.study.state.metric_backfill import backfill_and_last_step

    run_id, metric = t.user_attrs.get(RUN_ID), runs.metric
    epoch = max((int(h["epoch"]) for h in history), default=0)
    for h in history:  # (its driver died between the checkpoint and the report)
        v = h.get(metric)
        if int(h["epoch"]) not in t.intermediate_values and isinstance(v, (int, float)) and not isinstance(v, bool):
            guard(storage.set_trial_intermediate_value, t._trial_id, int(h["epoch"]), float(v))
    t = guard(storage.get_trial, t._trial_id)
    restored, logged = {}, 0
    if run_id:
        restored, logged = backfill_and_last_step(runs.client, run_id, t, metric, runs.trial_dir(t.number), runs.tracking_uri,
                                                  history, up_to=epoch, note=runs.note)
        if logged is None:  # (the backfill failed, noted, or never read the metric: what the run has, read on its own)
            logged = max((m.step for m in runs.client.get_metric_history(run_id, metric)), default=0)
    until = t.system_attrs.get(SEGMENT_UNTIL, until)
    if until and epoch >= int(until["epoch"]):  # it reached its pause point: paused there
        rung, at = int(until["rung"]), int(until["epoch"])
        return {"rung": rung, "epoch": at}, {"hpolab.state": "PAUSED", "hpolab.rung": str(rung), "hpolab.paused_at_epoch": str(at), **restored}
    after = int(t.system_attrs.get(SEGMENT_AFTER, 0))
    info = {"rung": int(t.user_attrs.get(RUNG, -1)), "epoch": epoch, "interrupted": True, "after": after, "logged": logged}
    return info, {"hpolab.state": "PAUSED", "hpolab.interrupted_at_epoch": str(epoch), **restored}


def end_paused(study: optuna.Study, t: FrozenTrial, state: TrialState, tags: dict[str, str], runs: RunSide,
               guard: Callable[..., Any] = passthrough) -> bool:
    """A trial still paused when nothing can run ends as the scheduler says (ASHA: PRUNED at its rung):
    Optuna told, then its run closed. False when Optuna refused (noted; the run stays open)."""
    info = paused_mark(t) or {}
    value = t.intermediate_values.get(info.get("epoch")) if state == TrialState.COMPLETE else None
    with step("ended_paused"):
        try:
            guard(tell_optuna, study, t.number, value, state=None if state == TrialState.COMPLETE else state, skip_if_finished=True)
        except Exception as e:
            runs.note(f"trial {t.number}: ending it {state.name} failed: {type(e).__name__}: {e}")
            return False
        run_id = t.user_attrs.get(RUN_ID)
        if run_id:
            close_run(runs.close, run_id, state, {"hpolab.rung": str(info.get("rung")), **tags})
    return True


def unclaim_paused(storage, t: FrozenTrial, guard: Callable[..., Any] = passthrough) -> None:
    """A paused trial claimed when a stop signal came, before its segment started: paused again with
    its mark (the scheduler's recorded decision stands; the next driver resumes it)."""
    with step("given_back"):
        guard(storage.set_trial_system_attr, t._trial_id, PAUSED, t.system_attrs[PAUSED])
        guard(storage.set_trial_user_attr, t._trial_id, OWNER, {"trial": t.number, PAUSED_OWNER: True})
