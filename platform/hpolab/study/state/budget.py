"""The study's trial budget: how many trials it has, and whether this worker may start another.

`n_trials` is the study's total of finished trials (COMPLETE + PRUNED + FAIL, not counting failures
that were retried, imported or released trials: stores/trial_counts.py, the rule `study list` and
`study status` count by too). `budget.epochs` is spent by the rule of trial_counts.epochs_used, which
`study status` and the report use too. Counts are read from the Optuna storage every time, because other
workers may be adding trials to the same study.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from hpolab.stores.trial_counts import count_trials, epochs_used, in_budget
from hpolab.stores.trial_states import ASIDE, retried_numbers, state_of

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def trial_counts(study: optuna.Study) -> dict[str, int]:
    """The study's counts by the one rule every reader uses (stores/trial_counts.py)."""
    return count_trials(study.get_trials(deepcopy=False))


def may_start_another(counts: dict[str, int], n_trials: int) -> bool:
    """Whether one more trial fits the budget, given `trial_counts` of the study now."""
    # Running and waiting trials count against the budget (they will finish), but a WAITING trial
    # (a retry copy) is always picked up while the study is not done, so it is not left behind.
    if in_budget(counts) >= n_trials and counts["waiting"] == 0:
        return False
    return counts["finished"] < n_trials


def count_existing_trials(storage: optuna.storages.RDBStorage, name: str) -> int:
    """Trials the study already has (0 when it does not exist yet): mixed into the sampler seed so a
    re-run draws new points instead of repeating the first run's."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return 0
    return len(storage.get_all_trials(study_id, deepcopy=False))


def over_budget(study: optuna.Study, trial_number: int, n_trials: int) -> bool:
    """The optimistic budget check, for storages where no lock can be taken (the gRPC proxy).

    Trial numbers are handed out in one total order, so among workers racing for the last slots the
    first n_trials numbers win: a trial is over budget when the trials numbered below it that count
    (not released, not a retried failure) already fill the budget. The loser gives its trial back
    (`release`) before it runs.
    """
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    ahead = [t for t in trials if t.number < trial_number and state_of(t, retried) not in ASIDE]
    return len(ahead) >= n_trials


NOT_THE_TRIALS_FAULT = ("interrupted", "driver", "reaped", "tell")  # fail kinds the failure streak ignores


class FailureStreak:
    """Consecutive failed trials of this driver, against the spec's `max_failures` (None: no limit).

    Counted: trials whose final outcome is FAIL by their own doing (an exception, NaN, a study metric
    never finite, a process death, a timeout or OOM that could not be retried). Not counted: a failed
    attempt that was retried (its retry is what counts), interrupted trials (Ctrl-C, SIGTERM, a dead
    driver), a trial another worker reaped while it ran here, and one Optuna could not be told of.
    A COMPLETE or PRUNED trial resets the streak. One trial that broke the own-loop contract (fail
    kind "contract": its train() calls the trial wrongly, as every trial would) is the limit at once."""

    def __init__(self, max_failures: int | None):
        self.max_failures = max_failures
        self.count = 0
        self.last_reason: str | None = None
        self.contract: str | None = None  # the first contract failure: "trial N broke the own-loop contract: ..."

    def record(self, state: TrialState, retried: bool, kind: str | None, reason: str | None, number: int | None = None) -> None:
        if state in (TrialState.COMPLETE, TrialState.PRUNED):
            self.count = 0
        elif state == TrialState.FAIL and not retried and kind not in NOT_THE_TRIALS_FAULT:
            self.count += 1
            self.last_reason = reason
            if kind == "contract" and self.contract is None:
                self.contract = f"trial {number} {CONTRACT_BROKEN}: {reason}"

    @property
    def hit(self) -> bool:
        return self.contract is not None or (self.max_failures is not None and self.count >= self.max_failures)

    def why(self) -> str:
        """The line saying why the driver stops starting trials."""
        if self.contract is not None:
            return self.contract
        return f"{self.count} trials failed in a row (max_failures={self.max_failures}); the last: {self.last_reason}"


CONTRACT_BROKEN = "broke the own-loop contract"


def epoch_budget_spent(trials, spec, in_flight: int = 0) -> bool:
    """Whether `budget.epochs` is used up: no trial may start or resume (None: no epoch budget).
    `in_flight`: epochs the segments training now will still train (a trial scheduler's: driver/pauses.py)."""
    limit = spec.budget.epochs
    return limit is not None and epochs_used(trials) + in_flight >= limit
