"""Seed trials: a configuration trained again on another training seed, as an ordinary trial.

A promotion race (registry/race.py) and a noise probe (study/sampling/noise_probe.py) measure how
much a configuration's metric moves with the training seed alone. Each of their runs is a trial of an
Optuna study, started by the same driver as any other: its own process, its MLflow run, heartbeats,
retries, the budget lock. What makes it a seed trial is on the trial, from the moment it is queued
(WAITING, so the next `ask()` takes it):

    SEED     user attr: its training seed, which replaces the config's `seed`. The config's
             `data_seed` stays, so the splits do not move (train/data.py data_seed_of).
    CONFIG   user attr, optional: the whole config it trains, as a race candidate's trial ran it
             (whatever the spec says now); without it, the spec's config with the trial's params.
    CANDIDATE  user attr, optional: which configuration it retrains (a race's candidate label).

A retry copy carries all three (study/state/retry.py CARRIED_USER_ATTRS): an interrupted seed trial
resumes as the same configuration on the same seed.
"""

from __future__ import annotations

import copy
from typing import Any

import optuna
from optuna.trial import TrialState, create_trial

SEED = "hpolab.seed"
CONFIG = "hpolab.config"
CANDIDATE = "hpolab.race_candidate"


def trial_config(spec, experiment, trial) -> dict[str, Any]:
    """The config a trial trains: a seed trial's fixed config (or the spec's with its params) on its
    seed; any other trial's, the spec's config with its params (StudySpec.resolved_config)."""
    fixed = trial.user_attrs.get(CONFIG)
    config = copy.deepcopy(fixed) if fixed is not None else spec.resolved_config(experiment, trial.params)
    seed = trial.user_attrs.get(SEED)
    if seed is not None:
        config["data_seed"] = config.get("data_seed", config["seed"])  # a config from before data_seed: its split stays
        config["seed"] = int(seed)
    return config


def queue_seed_trial(study: optuna.Study, seed: int, *, params: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
                     user_attrs: dict[str, Any] | None = None, system_attrs: dict[str, Any] | None = None) -> None:
    """Queue one seed trial (WAITING). `params`: fixed values the sampler's distributions take (a noise
    probe's: the incumbent's, so the sampler sees them as its own); `config`: the whole config (a race's)."""
    attrs = {**(user_attrs or {}), SEED: int(seed), **({CONFIG: config} if config is not None else {})}
    study.add_trial(create_trial(state=TrialState.WAITING, system_attrs={"fixed_params": dict(params or {}), **(system_attrs or {})},
                                 user_attrs=attrs))


def seed_trial_tags(trial) -> dict[str, str]:
    """A seed trial's run tags (hpolab.seed, hpolab.race_candidate); {} for any other trial."""
    return {k: str(trial.user_attrs[k]) for k in (CANDIDATE, SEED) if trial.user_attrs.get(k) is not None}
