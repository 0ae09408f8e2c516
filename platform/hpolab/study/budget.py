"""The study's trial budget: how many trials it has, and whether this worker may start another.

`n_trials` is the study's total of finished trials (COMPLETE + PRUNED + FAIL, not counting failures
that were retried). Counts are read from the Optuna storage every time, because other workers may
be adding trials to the same study.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def trial_counts(study: optuna.Study) -> dict[str, int]:
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    counts = {"complete": 0, "pruned": 0, "fail": 0, "running": 0, "waiting": 0, "retried": 0}
    for t in trials:
        if t.state == TrialState.FAIL and t.number in retried:
            counts["retried"] += 1
        elif t.state in FINISHED or t.state in (TrialState.RUNNING, TrialState.WAITING):
            counts[t.state.name.lower()] += 1
    counts["finished"] = counts["complete"] + counts["pruned"] + counts["fail"]
    return counts


def may_start_another(counts: dict[str, int], n_trials: int) -> bool:
    """Whether one more trial fits the budget, given `trial_counts` of the study now."""
    # Running and waiting trials count against the budget (they will finish), but a WAITING trial
    # (a retry copy) is always picked up while the study is not done, so it is not left behind.
    if counts["finished"] + counts["running"] + counts["waiting"] >= n_trials and counts["waiting"] == 0:
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
