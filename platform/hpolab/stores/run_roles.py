"""What an MLflow run in a study's experiment is: the tag `hpolab.role` on every run hpolab creates.

  trial          one trial's run `trial-<n>` (also tagged optuna.trial_number)
  study          the study's parent run
  promote        a promotion `promote-trial-<n>` (also tagged optuna.trial_number: the trial it promotes)
  lr_range_test  the LR range test before the first trial

Only a trial run is a trial's run: the checks and repairs that pair runs with trials (study check,
the repair every driver runs, ...) take no other. Stores written before trial runs carried the role
hold trial runs without it: a run without a role is a trial run when it has optuna.trial_number,
as it was then.
"""

from __future__ import annotations

from typing import Mapping

ROLE = "hpolab.role"
TRIAL, STUDY, PROMOTE, LR_RANGE_TEST = "trial", "study", "promote", "lr_range_test"


def is_trial_run(tags: Mapping[str, str]) -> bool:
    """Whether a run with these tags is a trial's run (see the module doc for runs without a role)."""
    role = tags.get(ROLE)
    if role is None:
        return "optuna.trial_number" in tags  # written before trial runs were tagged with their role
    return role == TRIAL
