"""What a driver takes next, under the study's budget lock (the trial lifecycle's claims:
study/state/lifecycle.py): a dead driver's claimed trial first, then a trial scheduler's paused trial
that may resume, then a new (or WAITING) trial while n_trials and budget.epochs allow.

One read of the study's trials under the lock serves the claim and the look for dead drivers' trials
(each read fetches every unfinished trial, a paused one too: its cost grows with them). When it finds
one to reap, or a retry copy owed, the claim gives way: the driver reaps outside the lock (a reap
restores and closes runs in MLflow, which must not hold up other workers' claims) and claims again.

Counted and claimed under the lock: with any number of workers, never more than n_trials (the asked
trial is RUNNING, so the next worker's count includes it), no new trial once budget.epochs is spent
(a WAITING retry copy still runs; no paused trial resumes), and two workers never take the same
trial. A stop signal (Ctrl-C, SIGTERM) read under the lock claims nothing; one that comes while a
trial is being claimed gives it back before it starts (give_back).
"""

from __future__ import annotations

import optuna

from hpolab.stores.budget_lock import budget_lock
from hpolab.stores.trial_counts import count_trials
from hpolab.study.driver.heartbeat import dead_trials
from hpolab.study.driver.pauses import Claimed
from hpolab.study.lr_test.lr_step import lr_bounds
from hpolab.study.sampling.search_space import optuna_distributions
from hpolab.study.state import lifecycle
from hpolab.study.state.budget import epoch_budget_spent, may_start_another, over_budget
from hpolab.study.state.repair import delete_unlinked_runs


REAP_FIRST = "reap first"  # claim_next's answer when its read finds a dead driver's trial to reap


def claim(d) -> optuna.Trial | Claimed | None:
    """The trial driver `d` starts next (None: nothing now); dead drivers' trials that the claim's read
    finds are reaped first, outside the lock (the module doc)."""
    d.pruning.close_orphans(d.study)  # several objectives: a dead driver's companion trials (before the ask)
    trial = claim_next(d)
    if trial is REAP_FIRST:
        d.reap()
        trial = claim_next(d, reaped=True)
    return trial


def claim_next(d, reaped: bool = False) -> optuna.Trial | Claimed | str | None:
    """Under the lock: what `d` starts next, or REAP_FIRST (not once `reaped`: the driver just did)."""
    with budget_lock(d.storage, d.spec.name) as locked:
        if d.signals.stopping:
            return None
        trials = d.study.get_trials(deepcopy=False)
        if not reaped:
            d._dead_claimed, dead = dead_trials(d.study, d.storage, d.running, trials, d.beat_watch)
            if dead or lifecycle.owed(trials):
                return REAP_FIRST
        counts = count_trials(trials)  # (the trials just read: not a second read under the lock)
        in_flight = d.pauses.in_flight(trials) if d.pauses else 0  # (slots never spend the last epochs twice)
        spent = epoch_budget_spent(trials, d.spec, in_flight)
        taken = take_over(d, spent)
        if taken is not None or (spent and not counts["waiting"]):
            return taken
        claimed = d.pauses.claim(trials) if d.pauses and not spent else None
        if claimed is not None or (d.pauses and not d.pauses.may_start_new(trials)):
            return claimed
        if not may_start_another(counts, d.spec.n_trials):
            return None
        # Whether a fresh trial may follow this one (else the driver forks no standby process for it;
        # a resume, a retry copy or a take-over may still come, and starts without one).
        after = {**counts, "running": counts["running"] + 1, "waiting": max(0, counts["waiting"] - 1)}
        d.more_to_start = bool(d.pauses) or may_start_another(after, d.spec.n_trials)
        distributions = optuna_distributions(d.spec, lr_bounds(d.study))
        optimistic = None if locked else (lambda n: over_budget(d.study, n, d.spec.n_trials))  # (no lock: the proxy)
        return lifecycle.claim(d.study, d.storage, distributions, optimistic, d.outage.call, no_waiting=locked and not counts["waiting"])


def take_over(d, spent: bool) -> optuna.Trial | None:
    """A claimed trial whose driver died before making its run: driver `d`'s now, in the same Optuna
    trial (nothing of it was trained or logged); released unrun once budget.epochs is spent."""
    for t in d._dead_claimed:
        trial = lifecycle.reclaim(d.study, d.storage, t, d.outage.call)
        if trial is None:
            continue  # (another worker took it)
        if spent:
            d.outage.call(lifecycle.release, d.study, trial)
            continue
        d.outage.call(delete_unlinked_runs, d.client, d.experiment_id, d.study, t.number)  # (made, never linked: empty)
        d.progress.note(f"trial {t.number}: its driver died before starting it; started here, in the same trial")
        return trial
    return None


def give_back(d, trial) -> None:
    """A trial claimed when a stop signal came: a paused one is paused again; a new one stays claimed
    (no run made, nothing trained) and the next driver takes it over (lifecycle.reclaim)."""
    if isinstance(trial, Claimed):
        d.outage.call(lifecycle.unclaim_paused, d.storage, trial.trial, d.outage.call)
    number = trial.trial.number if isinstance(trial, Claimed) else trial.number
    d.progress.note(f"trial {number}: not started (stopping); the next run takes it")
