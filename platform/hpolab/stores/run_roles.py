"""What an MLflow run in a study's experiment is: the tag `hpolab.role` on every run hpolab creates.

  trial          one trial's run `trial-<n>` (also tagged optuna.trial_number)
  study          the study's parent run
  promote        a promotion `promote-trial-<n>` (also tagged optuna.trial_number: the trial it promotes)
  lr_range_test  the LR range test before the first trial
  race           a promotion race (registry/race.py) under the study's parent run; its seed runs are
                 trial runs of the race's own Optuna study (tag optuna.study names that one)

Only a trial run is a trial's run: the checks and repairs that pair runs with trials (study check,
the repair every driver runs, ...) take no other. Stores written before trial runs carried the role
hold trial runs without it: a run without a role is a trial run when it has optuna.trial_number,
as it was then.
"""

from __future__ import annotations

from typing import Mapping

ROLE = "hpolab.role"
TRIAL, STUDY, PROMOTE, LR_RANGE_TEST, RACE = "trial", "study", "promote", "lr_range_test", "race"


def is_trial_run(tags: Mapping[str, str], study: str | None = None) -> bool:
    """Whether a run with these tags is a trial's run (see the module doc for runs without a role);
    with `study`, a run of that Optuna study's trials: a study's experiment also holds the seed runs of
    its promotion races, trials of another Optuna study (a run without the tag is the study's own)."""
    if study is not None and tags.get("optuna.study", study) != study:
        return False
    role = tags.get(ROLE)
    if role is None:
        return "optuna.trial_number" in tags  # written before trial runs were tagged with their role
    return role == TRIAL
