"""Retry copies: a failed attempt comes back as a new WAITING trial with the same params.

Like Optuna's RetryHeartbeatStaleTrialCallback (same `failed_trial` / `retry_history` system
attrs, so its helpers read ours), with three differences: the copy does not inherit the dead
attempt's `mlflow_run_id` or owner record; it may carry trainer overrides for the next attempt
(`hpolab.trainer_overrides`, e.g. the halved micro-batch after a CUDA OOM); and the caller learns
the new trial's number (None when max_retries is spent). The next driver to ask() picks the copy up
and resumes it from the latest checkpoint of its chain (tracker.retry_source).
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpolab.study.owners import OWNER_ATTR

NOT_INHERITED = ("mlflow_run_id", OWNER_ATTR)
OVERRIDES = "hpolab.trainer_overrides"


class RetryCopy:
    def __init__(self, max_retries: int):
        self.max_retries = max_retries

    def __call__(self, study: optuna.Study, trial: FrozenTrial, kind: str = "stale",
                 overrides: dict[str, Any] | None = None) -> int | None:
        history = [*trial.system_attrs.get("retry_history", []), trial.number]
        if len(history) > self.max_retries:
            return None
        system_attrs = {**trial.system_attrs, "failed_trial": history[0], "retry_history": history, "hpolab.retry_kind": kind}
        if overrides:
            system_attrs[OVERRIDES] = {**trial.system_attrs.get(OVERRIDES, {}), **overrides}
        study.add_trial(optuna.create_trial(
            state=TrialState.WAITING, params=trial.params, distributions=trial.distributions,
            user_attrs={k: v for k, v in trial.user_attrs.items() if k not in NOT_INHERITED},
            system_attrs=system_attrs))
        for t in reversed(study.get_trials(deepcopy=False)):
            if t.system_attrs.get("retry_history") == history:
                return t.number
        return None
