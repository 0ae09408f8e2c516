"""Retry copies: a failed attempt comes back as a new WAITING trial with the same params.

Like Optuna's RetryHeartbeatStaleTrialCallback (same `failed_trial` / `retry_history` system
attrs, so its helpers read ours), with three differences: the copy carries only the attrs listed in
CARRIED_SYSTEM_ATTRS / CARRIED_USER_ATTRS (not the dead attempt's run, owner or reaped mark); it may
carry trainer overrides for the next attempt (`hpolab.trainer_overrides`, e.g. the halved micro-batch after a CUDA OOM); and the caller learns
the new trial's number (None when max_retries or max_interrupts is spent). The next driver to ask() picks the copy up
and resumes it from the latest checkpoint of its chain (retry_source): the dead attempt's last.pt
in this worker's trial folder, or else the one it uploaded to its MLflow run's checkpoints/ (any
worker: the attempt may have run on another machine).

What consumes `max_retries`: only failures of the trial itself (a CUDA OOM, a trial_timeout). An
interrupt (Ctrl-C, SIGTERM), a dead driver (its owner gone, or its heartbeats stale) and a trial
reaped while its owner still ran it never do: the chain records why each attempt ended
(`hpolab.retry_kinds`, parallel to `retry_history`) so the count can tell them apart. Those count
against `max_interrupts` instead (default 10 per chain).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpolab.stores.artifacts import CHECKPOINTS, fetch_checkpoint
from hpolab.stores.paths import Stores

OVERRIDES = "hpolab.trainer_overrides"
# What a copy carries of its attempt, and why; nothing else. The rest describes that attempt alone and
# would mislead about the copy: its owner record, MLflow run, worker seed and objective values; its
# reaped mark (a later tell error would take the copy for reaped and drop its model; a later reaper would
# be misnamed), its proxy heartbeat, its constraint values; a sampler's notes on how it sampled (the
# sampler writes its own when the copy is asked). The chain (failed_trial, retry_history, kinds) is rebuilt.
CARRIED_SYSTEM_ATTRS = {
    "fixed_params": "an enqueued configuration stays one: enqueue's duplicate check and the spec guard read it off queued trials",
    "grid_id": "GridSampler: the copy is the same grid point (Optuna's own retry callback carries it); without it the sampler picks another",
    "search_space": "GridSampler: the grid that grid_id indexes",
    OVERRIDES: "trainer overrides of earlier attempts (the halved micro-batch after an OOM) still apply; this retry's are merged in",
}
CARRIED_USER_ATTRS = {
    "hpolab.warm_start_from": "where the configuration came from (a warm start's enqueued trial)",
    "hpolab.config_changes": "a trial scheduler's config changes so far (PBT): the copy resumes the same configuration",
    "hpolab.pbt_schedule": "a PBT member's schedule so far (what `hpolab reproduce` replays)",
    "hpolab.pbt_parents": "a PBT member's exploits so far (its lineage; also tagged on the copy's run)",
    "hpolab.seed": "a seed trial's training seed (study/sampling/seed_trials.py): the copy trains the same seed",
    "hpolab.config": "a seed trial's whole config (a promotion race's candidate): the copy trains the same configuration",
    "hpolab.race_candidate": "which race candidate a seed trial retrains: the copy's result counts for it",
}
KINDS = "hpolab.retry_kinds"  # system attr: why each attempt of retry_history ended, in the same order
# Why an attempt ended that is not the trial's fault: its retry is free (never counts against max_retries).
FREE_KINDS = frozenset({"interrupted", "driver", "stale", "owner_gone", "reaped"})


def chain_kinds(trial: FrozenTrial, kind: str) -> list[str | None]:
    """Why each attempt of the chain ending in `trial` (which ended for `kind`) ended. Attempts of
    a chain recorded before kinds were (None) count as failures of the trial, as they used to."""
    history = trial.system_attrs.get("retry_history", [])
    kinds = list(trial.system_attrs.get(KINDS, []))[-len(history):] if history else []
    return [*[None] * (len(history) - len(kinds)), *kinds, kind]


def retries_used(kinds: list[str | None]) -> int:
    """How many attempts of a chain count against max_retries: the trial's own failures only."""
    return sum(1 for k in kinds if k not in FREE_KINDS)


def interrupts_used(kinds: list[str | None]) -> int:
    """How many attempts of a chain count against max_interrupts: those that ended for a FREE_KINDS reason."""
    return sum(1 for k in kinds if k in FREE_KINDS)


MAX_INTERRUPTS = 10  # the spec's default max_interrupts (config/spec.py), for callers without a spec


class RetryCopy:
    """Queues the retry copy of a failed attempt, or refuses (None) once the chain has used up
    `max_retries` (the trial's own failures) or `max_interrupts` (interrupts, dead drivers, reaps:
    free of max_retries, but a configuration that keeps taking its driver down is not retried forever)."""

    def __init__(self, max_retries: int, max_interrupts: int = MAX_INTERRUPTS):
        self.max_retries = max_retries
        self.max_interrupts = max_interrupts

    def refusal(self, kind: str) -> str:
        """Why an attempt that ended for `kind` got no retry copy (the end of its fail reason)."""
        if kind in FREE_KINDS:  # an interrupt adds nothing to max_retries: it was max_interrupts
            return f"not retried (max_interrupts={self.max_interrupts} reached: interrupted or its driver lost that many times)"
        return f"not retried (max_retries={self.max_retries} reached)"

    def __call__(self, study: optuna.Study, trial: FrozenTrial, kind: str = "stale",
                 overrides: dict[str, Any] | None = None, dry: bool = False) -> int | bool | None:
        """The copy's number (None: refused). `dry`: only whether a copy would be queued."""
        history = [*trial.system_attrs.get("retry_history", []), trial.number]
        kinds = chain_kinds(trial, kind)
        allowed = retries_used(kinds) <= self.max_retries and interrupts_used(kinds) <= self.max_interrupts
        if dry:
            return allowed
        for t in study.get_trials(deepcopy=False):
            if t.system_attrs.get("retry_history") == history:
                return t.number  # (queued already: an attempt has one copy, whoever queues it)
        if not allowed:
            return None
        system_attrs = {k: v for k, v in trial.system_attrs.items() if k in CARRIED_SYSTEM_ATTRS}
        system_attrs.update({"failed_trial": history[0], "retry_history": history, KINDS: kinds, "hpolab.retry_kind": kind})
        if overrides:
            system_attrs[OVERRIDES] = {**trial.system_attrs.get(OVERRIDES, {}), **overrides}
        study.add_trial(optuna.create_trial(
            state=TrialState.WAITING, params=trial.params, distributions=trial.distributions,
            user_attrs={k: v for k, v in trial.user_attrs.items() if k in CARRIED_USER_ATTRS},
            system_attrs=system_attrs))
        for t in reversed(study.get_trials(deepcopy=False)):
            if t.system_attrs.get("retry_history") == history:
                return t.number
        return None


@dataclass
class RetrySource:
    """What a retry copy continues: the attempt it retries, the checkpoint to resume from, the run
    tags saying so, and trainer overrides for this attempt (e.g. the halved micro-batch after an OOM)."""

    retry_of: int | None = None
    resume_from: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)


def retry_source(study: optuna.Study, stores: Stores, study_name: str, number: int) -> RetrySource:
    """What trial `number` continues (all empty when it is not a retry copy).

    It resumes from the newest last.pt of its chain: the attempt it retries, or an earlier one when
    that attempt died before its first epoch ended (or before its first upload). Per attempt, newest
    first: the local trial folder (same worker: at least as new as any upload), else the attempt's
    uploaded checkpoints/last.pt, downloaded into this trial's folder (`fetched/`)."""
    storage = study._storage  # this trial alone first: most are no retry copy (a read of every trial costs O(trials))
    me = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(study._study_id, number))
    history = me.system_attrs.get("retry_history") or []
    if not history:
        return RetrySource()
    trials = study.get_trials(deepcopy=False)
    src = RetrySource(retry_of=history[-1], overrides=dict(me.system_attrs.get(OVERRIDES) or {}))
    src.tags["hpolab.retry_of_trial"] = str(src.retry_of)
    src.tags["hpolab.retry_kind"] = str(me.system_attrs.get("hpolab.retry_kind", "stale"))
    dead = trials[src.retry_of]
    if dead.user_attrs.get("mlflow_run_id"):
        src.tags["hpolab.retry_of_run"] = dead.user_attrs["mlflow_run_id"]
    if dead.user_attrs.get("hpolab.pbt_parents"):  # a PBT member's lineage goes on in the copy's run
        src.tags.update({"hpolab.pbt_parents": ",".join(dead.user_attrs["hpolab.pbt_parents"]),
                         "hpolab.pbt_exploited_from": dead.user_attrs["hpolab.pbt_parents"][-1]})
    for n in reversed(history):
        last = stores.trial_dir(study_name, n) / "last.pt"
        run_id = trials[n].user_attrs.get("mlflow_run_id")
        if last.exists():
            src.resume_from, where, kind = str(last), str(last), "local"
        elif run_id:
            try:
                fetched = fetch_checkpoint(stores.tracking_uri, run_id, stores.trial_dir(study_name, number) / "fetched")
            except Exception as e:  # an unreachable artifact store: try older attempts, else start over (said in a tag)
                src.tags["hpolab.resume_error"] = f"fetching runs:/{run_id}/{CHECKPOINTS}/last.pt: {type(e).__name__}: {e}"
                fetched = None
            if fetched is None:
                continue
            src.resume_from, where, kind = str(fetched), f"runs:/{run_id}/{CHECKPOINTS}/last.pt", "artifact"
        else:
            continue
        src.tags.update({"hpolab.resumed_from": where, "hpolab.resume_source": kind})
        break
    if src.overrides:
        src.tags["hpolab.trainer_overrides"] = " ".join(f"{k}={v}" for k, v in sorted(src.overrides.items()))
    return src
