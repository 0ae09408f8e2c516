"""Warm start's choice of configurations, on a real SQLite store and no training: the same
configuration finishing twice in the earlier study (NSGA-II's crossover can copy a parent; a retry
re-runs one) is enqueued once, and the next best configuration takes the other slot."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from hpolab.config.spec import load_spec
from hpolab.study import warm_start

DISTS = {"trainer.lr": FloatDistribution(3e-4, 3e-2, log=True), "model.channels": CategoricalDistribution([4, 8, 16, 32]),
         "model.depth": IntDistribution(1, 3), "model.dropout": FloatDistribution(0.0, 0.4)}


def _trial(lr: float, acc: float, latency: float) -> optuna.trial.FrozenTrial:
    params = {"trainer.lr": lr, "model.channels": 8, "model.depth": 2, "model.dropout": 0.1}
    return create_trial(state=TrialState.COMPLETE, values=[acc, latency], params=params, distributions=DISTS,
                        system_attrs={"constraints": [-1.0]})


def test_a_configuration_that_finished_twice_is_enqueued_once(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    source = optuna.create_study(study_name="earlier", storage=storage, directions=["maximize", "minimize"])
    for lr, acc, latency in ((1e-3, 0.99, 1.0), (1e-3, 0.99, 1.0), (2e-3, 0.98, 1.0), (5e-3, 0.5, 2.0)):
        source.add_trial(_trial(lr, acc, latency))
    spec = load_spec("studies/digits_pareto.yaml", ["name=later", "warm_start={from: earlier, top_k: 2}"])
    study = optuna.create_study(study_name="later", storage=storage, directions=["maximize", "minimize"])
    summary = warm_start.apply(study, storage, spec, warm_start.check_source(storage, spec), None)
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [t.user_attrs["hpolab.warm_start_from"] for t in waiting] == ["earlier trial 0", "earlier trial 2"]
    assert [t.system_attrs["fixed_params"]["trainer.lr"] for t in waiting] == [1e-3, 2e-3]
    assert "2 best configurations enqueued (trials 0, 2)" in summary
    assert warm_start.apply(study, storage, spec, source, None) is None  # once per study
