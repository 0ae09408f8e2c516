"""The checks of `hpolab study check` (check.py), each with its repair where one exists: the
`Problem`s found in a study's two stores, read once (check_read.py).

A repair never deletes: it sets tags, closes a run with Optuna's state, restores a deleted run,
recovers a running trial of a dead driver as the next `study run` would (the trial lifecycle's
functions, study/state/lifecycle.py: under a trial scheduler put back to paused in the same trial
and run; otherwise FAIL with a retry copy), queues an interrupted attempt to resume, or records that
an artifact is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

from optuna.trial import FrozenTrial, TrialState

from hpolab.analysis.check_read import Study, set_tags
from hpolab.stores.artifacts import local_artifact_dir
from hpolab.stores.trial_states import OWNED, RETRY_HISTORY, RUN_ID, State, retried_numbers, state_of, states
from hpolab.study.state import lifecycle
from hpolab.study.state.budget import trial_counts
from hpolab.study.state.metric_backfill import backfill_run
from hpolab.stores.optuna_storage import GRACE_PERIOD
from hpolab.stores.run_roles import is_trial_run
from hpolab.study.state.owners import describe, heartbeat_age, owner_gone, owner_of, owner_record, this_host, why_dead
from hpolab.study.state.retry import MAX_INTERRUPTS, RetryCopy

MLFLOW_STATUS = {TrialState.COMPLETE: "FINISHED", TrialState.PRUNED: "KILLED", TrialState.FAIL: "FAILED"}
# Attempts that did not fail by their own doing: they are queued to resume (a retry copy).
INTERRUPT_KINDS = ("interrupted", "driver", "owner_gone", "stale")
BY_CHECK = "(recorded by hpolab study check)"


@dataclass
class Problem:
    trial: int | None  # None: the study as a whole
    what: str
    fix: str
    repair: Callable[[], str] | None = field(default=None, repr=False)  # does the fix; returns what it did

    def as_dict(self) -> dict[str, Any]:
        return {"trial": self.trial, "what": self.what, "fix": self.fix, "repairable": self.repair is not None}


UNLIMITED = 10**9  # a repair's retry copy: interrupts never use up max_retries (max_interrupts bounds them)


def _retry(s: Study, strict: bool = False) -> RetryCopy:
    """The retry copies a repair queues: bounded by the study's max_interrupts (its parent run's param;
    the default for a study recorded before there was one); `strict`: by its max_retries too (an owed
    copy: the driver's own limits)."""
    parent = s.runs.get(s.parent_id) if s.parent_id else None
    params = parent.data.params if parent is not None else {}
    interrupts, retries = params.get("max_interrupts", ""), params.get("max_retries", "")
    return RetryCopy(int(retries) if strict and retries.isdigit() else UNLIMITED, int(interrupts) if interrupts.isdigit() else MAX_INTERRUPTS)


def _tags_fix(s: Study, run_id: str, tags: dict[str, str], what: str) -> Callable[[], str]:
    def fix() -> str:
        set_tags(s, run_id, tags)
        return what
    return fix


def _retried(s: Study) -> set[int]:
    return retried_numbers(s.trials)


def _owner_alive(t: FrozenTrial) -> bool:
    """The trial's driver runs on this host and is alive (it may still be closing the trial's run)."""
    rec = owner_of(t)
    return rec is not None and rec.get("host") == this_host() and owner_gone(rec) is None


# ---------------------------------------------------------------- RUNNING trials


def running_problems(s: Study) -> list[Problem]:
    """Running trials without a live owner; fills `s.live` with those whose owner may be alive and
    `s.left_claimed` with claimed ones whose owner is gone (not a problem: nothing of them was trained
    or logged). A paused one has no process: nothing to check here."""
    owned = [t for t, state in states(s.trials) if state in OWNED]
    # Stale: no heartbeat for GRACE_PERIOD seconds (None: no heartbeat, or a storage without them)
    stale = {t._trial_id for t in owned if (heartbeat_age(s.storage, t._trial_id) or 0) > GRACE_PERIOD}
    out = []
    for t in owned:
        why = why_dead(t, stale, s.storage)
        if why is None:
            s.live.add(t.number)
            continue
        kind, reason = why
        if state_of(t) == State.CLAIMED:
            s.left_claimed[t.number] = reason
        elif s.scheduled:
            out.append(Problem(t.number, f"RUNNING in Optuna, but {reason}",
                               "put it back to paused in the same trial and run, at its newest checkpoint (what the next `study run` does)",
                               lambda t=t, kind=kind, reason=reason: _put_back(s, t, kind, reason)))
        else:
            out.append(Problem(t.number, f"RUNNING in Optuna, but {reason}",
                               "mark it FAIL, queue a retry copy that resumes it and close its run FAILED (what the next `study run` does)",
                               lambda t=t, kind=kind, reason=reason: _reap(s, t, kind, reason)))
    return out


def _reap(s: Study, t: FrozenTrial, kind: str, reason: str) -> str:
    me = owner_record(t.number)

    def close(run_id: str, state: TrialState, tags: dict[str, str]) -> None:
        if run_id in s.runs:
            set_tags(s, run_id, {**tags, "hpolab.state": "FAIL", "hpolab.fail_reason": f"{tags['hpolab.fail_reason']} {BY_CHECK}"})
            s.client.set_terminated(run_id, status="FAILED")

    done = lifecycle.reap(s.study, s.storage, t, (kind, reason), _retry(s), close, print,
                          by=f"hpolab study check --repair on {me['host']} pid {me['pid']}")
    run_id = t.user_attrs.get(RUN_ID)
    return done + (f", closed run {run_id} FAILED" if run_id in s.runs and done.startswith("marked") else "")


def _put_back(s: Study, t: FrozenTrial, kind: str, reason: str) -> str:
    """A trial scheduler's segment of a dead driver: paused again in the same trial and run (the
    reaper's put-back); past max_interrupts, failed as any trial."""
    runs = lifecycle.RunSide(s.client, s.stores.tracking_uri, lambda n: s.stores.trial_dir(s.name, n), s.user_attrs.get("metric"),
                             lambda run_id, tags: set_tags(s, run_id, {**tags, "hpolab.put_back_by": BY_CHECK}),
                             lambda *a: None, lambda _: None)
    info = lifecycle.put_back(s.storage, s.name, t, f"{reason} {BY_CHECK}", _retry(s).max_interrupts, runs)
    if info is None:
        return _reap(s, t, kind, reason)
    if not info:
        return "another worker recovered it meanwhile"
    return f"put back to paused after epoch {info['epoch']} in the same trial and run"


# ---------------------------------------------------------------- one trial and its run


def trial_problems(s: Study, t: FrozenTrial) -> list[Problem]:
    if state_of(t) in (State.RELEASED, State.IMPORTED, State.WAITING):
        return []  # given back unrun, imported by a warm start (its run is in its own study), or not started yet
    run_id = t.user_attrs.get("mlflow_run_id")
    if not run_id:
        if t.state == TrialState.RUNNING or (t.state == TrialState.FAIL and t.number in _retried(s)):
            return []  # starting now, or an attempt that died before its run was made (its retry has one)
        return [Problem(t.number, f"{t.state.name} in Optuna, but it has no MLflow run (no user attr mlflow_run_id)",
                        "none: nothing was logged for it")]
    run = s.runs.get(run_id)
    if run is None:
        return [Problem(t.number, f"its MLflow run {run_id} is not in experiment {s.name!r}",
                        "none: the run was purged (`mlflow gc`) or lives in another store (check --tracking-uri)")]
    out = []
    if run.info.lifecycle_stage == "deleted":
        out.append(Problem(t.number, f"its MLflow run {run_id} is deleted", "restore the run",
                           lambda: (s.client.restore_run(run_id), f"restored run {run_id}")[1]))
    want = {"optuna.trial_number": str(t.number), "optuna.study": s.name}
    if s.parent_id:
        want["mlflow.parentRunId"] = s.parent_id
    bad = {k: v for k, v in want.items() if run.data.tags.get(k) != v}
    if bad:
        shown = ", ".join(f"{k}={run.data.tags.get(k)!r}" for k in bad)
        out.append(Problem(t.number, f"its run {run_id} has {shown}", "set " + ", ".join(f"{k}={v}" for k, v in bad.items()),
                           _tags_fix(s, run_id, bad, "set " + ", ".join(bad))))
    return out + _state_problems(s, t, run) + _retry_problems(s, t, run) + _artifact_problems(s, t, run)


def _state_problems(s: Study, t: FrozenTrial, run) -> list[Problem]:
    tags, status, run_id = run.data.tags, run.info.status, run.info.run_id
    if t.state == TrialState.RUNNING:
        if status != "RUNNING" and t.number in s.live:
            return [Problem(t.number, f"RUNNING in Optuna, but its run {run_id} is {status}", "none: its driver closes the run when the trial ends")]
        return []
    out = []
    want = MLFLOW_STATUS[t.state]
    if tags.get("hpolab.state") != t.state.name or status != want:
        what = f"Optuna says {t.state.name}, its run {run_id} says hpolab.state={tags.get('hpolab.state')} status {status}"
        if status == "RUNNING" and _owner_alive(t):
            out.append(Problem(t.number, what + f"; its driver ({describe(owner_of(t))}) is alive and may still be closing it",
                               "none: check again when that driver is done"))
        else:
            fix = {"hpolab.state": t.state.name, "hpolab.state_repaired": f"was {tags.get('hpolab.state')}/{status} {BY_CHECK}"}
            if t.state == TrialState.FAIL and not tags.get("hpolab.fail_reason"):
                fix["hpolab.fail_reason"] = f"FAIL in Optuna, reason unknown {BY_CHECK}"

            def close(fix=fix) -> str:
                if status == "RUNNING":  # its dead driver's unwritten epochs first (study/state/metric_backfill.py)
                    fix.update(backfill_run(s.client, run_id, t, s.study.user_attrs.get("metric"),
                                            s.stores.trial_dir(s.name, t.number), s.stores.tracking_uri))
                set_tags(s, run_id, fix)
                s.client.set_terminated(run_id, status=want)
                return f"run {run_id}: hpolab.state={t.state.name}, status {want}"
            out.append(Problem(t.number, what, f"set hpolab.state={t.state.name} and status {want} (Optuna's state is the truth)", close))
    elif t.state == TrialState.FAIL and not tags.get("hpolab.fail_reason"):
        out.append(Problem(t.number, f"FAIL, but its run {run_id} has no hpolab.fail_reason", "set hpolab.fail_reason (unknown)",
                           _tags_fix(s, run_id, {"hpolab.fail_reason": f"unknown {BY_CHECK}"}, "set hpolab.fail_reason")))
    due = t.system_attrs.get(lifecycle.RETRY_DUE)  # (its driver died between the FAIL and the copy)
    kind = (due or {}).get("kind") or tags.get("hpolab.fail_kind") or t.system_attrs.get("hpolab.fail_kind")
    owed = due is not None or kind in INTERRUPT_KINDS
    if (t.state == TrialState.FAIL and owed and t.number not in _retried(s)
            and _retry(s, strict=True)(None, t, kind=kind, dry=True)):  # (past the limits: not retried on purpose)
        out.append(Problem(t.number, f"failed ({kind}) and owes a retry copy, which was never queued",
                           "queue the retry copy that resumes it from its last checkpoint (what the next `study run` does)",
                           lambda: _requeue(s, t, kind, run_id, (due or {}).get("overrides"))))
    return out


def _requeue(s: Study, t: FrozenTrial, kind: str, run_id: str, overrides: dict | None = None) -> str:
    copy = lifecycle.queue_retry(_retry(s, strict=True), s.study, t, kind, overrides or None)
    if copy is None:
        return _retry(s).refusal(kind)
    set_tags(s, run_id, {"hpolab.retried_as_trial": str(copy)})
    return f"queued to resume as trial {copy}"


def _retry_problems(s: Study, t: FrozenTrial, run) -> list[Problem]:
    history = t.system_attrs.get(RETRY_HISTORY) or []
    if not history or history[-1] >= len(s.trials):
        return []
    prev = s.trials[history[-1]]
    want = {"hpolab.retry_of_trial": str(prev.number)}
    if prev.user_attrs.get("mlflow_run_id"):
        want["hpolab.retry_of_run"] = prev.user_attrs["mlflow_run_id"]
    bad = {k: v for k, v in want.items() if run.data.tags.get(k) != v}
    if not bad:
        return []
    return [Problem(t.number, f"retry of trial {prev.number}, but its run does not say so ("
                    + ", ".join(f"{k}={run.data.tags.get(k)!r}" for k in bad) + ")",
                    "set " + ", ".join(f"{k}={v}" for k, v in bad.items()),
                    _tags_fix(s, run.info.run_id, bad, "set " + ", ".join(bad)))]


# ---------------------------------------------------------------- checkpoints and models


def _has_checkpoint(s: Study, run, name: str) -> bool:
    folder = local_artifact_dir(run.info.artifact_uri)
    if folder is not None:
        return (folder / "checkpoints" / name).is_file()
    return any(a.path.endswith(name) for a in s.client.list_artifacts(run.info.run_id, "checkpoints"))


def _model_exists(s: Study, model_id: str) -> bool:
    m = s.models.get(model_id)
    if m is None:
        return False
    folder = local_artifact_dir(m.artifact_location)
    return folder is None or (folder / "MLmodel").is_file()


def _checkpoint_fix(s: Study, t: FrozenTrial, run_id: str, name: str) -> tuple[str, Callable[[], str]]:
    local = s.stores.trial_dir(s.name, t.number) / name
    if local.is_file():
        def upload() -> str:
            s.client.log_artifact(run_id, str(local), "checkpoints")
            return f"uploaded {local} to run {run_id}'s checkpoints/"
        return f"upload {local} again", upload
    return ("record it as missing (hpolab.checkpoints_deleted)",
            _tags_fix(s, run_id, {"hpolab.checkpoints_deleted": f"missing from the artifact store {BY_CHECK}"},
                      "set hpolab.checkpoints_deleted (missing)"))


def _artifact_problems(s: Study, t: FrozenTrial, run) -> list[Problem]:
    tags, run_id = run.data.tags, run.info.run_id
    if run.info.status == "RUNNING" or run.info.lifecycle_stage == "deleted":
        return []  # still being written (or reported above)
    out = []
    # last.pt: uploaded while it ran (hpolab.checkpoint_epoch); best.pt: logged when it ended (hpolab.best_epoch)
    # A finished trial's last.pt is deleted on purpose (hpolab.last_checkpoint): nothing resumes it.
    wanted = {"last.pt": None if "hpolab.last_checkpoint" in tags else tags.get("hpolab.checkpoint_epoch"),
              "best.pt": None if "hpolab.best_checkpoint_missing" in tags else tags.get("hpolab.best_epoch")}
    for name, epoch in wanted.items():
        if (epoch or "0") in ("0", "None") or "hpolab.checkpoints_deleted" in tags or _has_checkpoint(s, run, name):
            continue
        fix, repair = _checkpoint_fix(s, t, run_id, name)
        out.append(Problem(t.number, f"its run {run_id} has no checkpoints/{name} (epoch {epoch}), and retention did not delete it",
                           fix, repair))
    model_id = tags.get("hpolab.model_id")
    if model_id and "hpolab.model_deleted" not in tags and not _model_exists(s, model_id):
        out.append(Problem(t.number, f"its run {run_id} names logged model {model_id}, which is missing",
                           "record it as missing (hpolab.model_deleted)",
                           _tags_fix(s, run_id, {"hpolab.model_deleted": f"missing {BY_CHECK}"}, "set hpolab.model_deleted (missing)")))
    reasons = ("hpolab.model_uri", "hpolab.model_skipped", "hpolab.model_error", "hpolab.model_deleted")
    if t.state == TrialState.COMPLETE and not any(tags.get(k) for k in reasons):
        out.append(Problem(t.number, f"COMPLETE, but its run {run_id} has no logged model and says no reason",
                           "record why (hpolab.model_error)",
                           _tags_fix(s, run_id, {"hpolab.model_error": f"no model was logged {BY_CHECK}"}, "set hpolab.model_error")))
    return out


# ---------------------------------------------------------------- runs without a trial, the parent run


def orphan_runs(s: Study) -> list[Problem]:
    """Trial runs that no trial points at (a driver killed between creating a run and linking it)."""
    linked = {t.user_attrs.get("mlflow_run_id") for t in s.trials}
    out = []
    for run in s.runs.values():
        tags, run_id = run.data.tags, run.info.run_id
        n = tags.get("optuna.trial_number")
        if n is None or not is_trial_run(tags, s.name) or run_id in linked or run.info.lifecycle_stage == "deleted" or tags.get("hpolab.orphan"):
            continue
        number = int(n) if n.isdigit() and int(n) < len(s.trials) else None
        if number is not None and number in s.live and run.info.status == "RUNNING":
            continue  # its driver is linking it now
        points = s.trials[number].user_attrs.get("mlflow_run_id") if number is not None else None

        def mark(run=run, number=number) -> str:
            set_tags(s, run.info.run_id, {"hpolab.orphan": f"no trial points at this run {BY_CHECK}"})
            if run.info.status == "RUNNING":
                s.client.set_terminated(run.info.run_id, status="KILLED")
            return f"marked run {run.info.run_id} hpolab.orphan" + (" and closed it KILLED" if run.info.status == "RUNNING" else "")
        out.append(Problem(number, f"run {run_id} ({run.info.status}) says trial {n}, but that trial points at {points or 'no run'}",
                           "mark it hpolab.orphan" + (" and close it KILLED" if run.info.status == "RUNNING" else "") + " (kept, not deleted)", mark))
    return out


def _budget(tags: dict[str, str], params: dict[str, str]) -> int | None:
    value = tags.get("hpolab.n_trials") or params.get("n_trials")
    return int(value) if value and value.isdigit() else None


def parent_problems(s: Study) -> list[Problem]:
    if not s.parent_id:
        return [Problem(None, "no parent run (study user attr mlflow_parent_run_id)", "none: the next `hpolab study run` creates one")]
    run = s.runs.get(s.parent_id)
    if run is None:
        return [Problem(None, f"parent run {s.parent_id} is not in experiment {s.name!r}", "none: it was purged or lives in another store")]
    out = []
    if run.info.lifecycle_stage == "deleted":
        out.append(Problem(None, f"parent run {s.parent_id} is deleted", "restore it",
                           lambda: (s.client.restore_run(s.parent_id), f"restored parent run {s.parent_id}")[1]))
    counts = trial_counts(SimpleNamespace(get_trials=lambda deepcopy=False: s.trials))  # the trials already read
    n_trials = _budget(run.data.tags, run.data.params)
    if n_trials is not None and counts["finished"] > n_trials:
        out.append(Problem(None, f"{counts['finished']} finished trials count against a budget of n_trials={n_trials}",
                           "none: more trials ran than the budget allows"))
    want = {f"hpolab.trials_{k}": str(v) for k, v in counts.items()}
    if run.info.status == "RUNNING":
        if not s.live:
            out.append(Problem(None, f"parent run {s.parent_id} is RUNNING, but no worker is running a trial",
                               "close it with the study's counts (FINISHED when the budget is spent, else KILLED)",
                               lambda: _close_parent(s, run, want, counts, n_trials)))
    elif run.info.status != "FAILED":
        bad = {k: v for k, v in want.items() if run.data.tags.get(k) != v}
        if bad:
            shown = ", ".join(f"{k}={run.data.tags.get(k)!r}" for k in bad)
            out.append(Problem(None, f"parent run {s.parent_id} has {shown}; the study has " + ", ".join(f"{k}={v}" for k, v in bad.items()),
                               "set the parent run's counts", _tags_fix(s, s.parent_id, bad, "set the parent run's counts")))
    return out


def _close_parent(s: Study, run, counts_tags: dict[str, str], counts: dict[str, Any], n_trials: int | None) -> str:
    done = (n_trials is not None and counts["finished"] >= n_trials) or bool(run.data.tags.get("hpolab.stop_reason"))
    status = "FINISHED" if done else "KILLED"
    set_tags(s, s.parent_id, {**counts_tags, "hpolab.closed_by": f"hpolab study check --repair {BY_CHECK}"})
    s.client.set_terminated(s.parent_id, status=status)
    return f"closed parent run {s.parent_id} {status} with the study's counts"
