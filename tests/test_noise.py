"""A study that knows its noise: the noise floor (its pooled spread over seeds), noise-aware stopping
(`min_delta: noise`, `stop_when_converged`) on fabricated results, then a real study whose noise probe
measures the floor and whose convergence rule ends it early."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from conftest import run_cli

from hpolab.study.objectives.convergence import Convergence, chance_to_beat
from hpolab.study.objectives.noise import NOISE_FLOOR, describe, noise_floor, pooled_sd
from hpolab.study.objectives.stopping import min_delta_of, no_improvement_streak


def test_the_pooled_noise_floor_and_how_it_is_said():
    floor, dof = pooled_sd([[0.90, 0.92, 0.94], [0.80, 0.81], [0.5]])
    assert dof == 3 and floor == pytest.approx(math.sqrt((0.0008 + 0.00005) / 3))
    assert pooled_sd([[1.0], []]) == (None, 0)
    attrs = {NOISE_FLOOR: {"value": 0.004, "metric": "val_acc", "source": "race", "dof": 12, "runs": 15, "configurations": 3}}
    assert noise_floor(attrs) == 0.004 and noise_floor({}) is None
    assert describe(attrs) == "0.004 (sd of val_acc over training seeds, 12 dof; a promotion race: 15 runs of 3 configurations)"


def test_min_delta_noise_counts_only_improvements_beyond_the_floor():
    rule = SimpleNamespace(min_delta="noise")
    assert min_delta_of(rule, {}) == 0.0  # nothing measured yet: every improvement counts
    attrs = {NOISE_FLOOR: {"value": 0.01}}
    assert min_delta_of(rule, attrs) == 0.01 and min_delta_of(SimpleNamespace(min_delta=0.2), attrs) == 0.2
    values = [0.90, 0.905, 0.908, 0.909, 0.95]
    assert no_improvement_streak(values[:4], True, 0.0) == (0, 3)  # each step is an improvement without a floor
    assert no_improvement_streak(values[:4], True, 0.01) == (3, 3)  # none beyond the floor of 0.01
    assert no_improvement_streak(values, True, 0.01)[0] == 0  # 0.95 is beyond it


def test_the_chance_to_beat_the_best_by_more_than_the_noise():
    converged = [0.93, 0.94, 0.935, 0.94, 0.938]  # spread no wider than the seed noise: nothing to find
    assert chance_to_beat(converged, 0.945, 0.01, "maximize") == 0.0
    exploring = [0.5, 0.7, 0.9, 0.6, 0.85, 0.3]  # configurations still far apart
    p = chance_to_beat(exploring, 0.9, 0.01, "maximize")
    s = float(np.std(exploring, ddof=1))
    tau = math.sqrt(s ** 2 - 0.01 ** 2)
    assert p == pytest.approx(0.5 * math.erfc((0.9 + 0.01 - np.mean(exploring)) / tau / math.sqrt(2))) and 0.05 < p < 0.5
    # a loss: the same numbers mirrored give the same chance
    assert chance_to_beat([-v for v in exploring], -0.9, 0.01, "minimize") == pytest.approx(p)


def test_convergence_needs_a_floor_min_trials_and_a_fresh_window():
    said = []
    rule = SimpleNamespace(threshold=0.05, window=3, min_trials=4)
    c = Convergence(rule, "maximize", "val_acc", said.append)
    values = [0.5, 0.9, 0.91, 0.905, 0.9]
    assert c.reason(values, 0, {}) is None and c.reason(values, 0, {}) is None
    assert len(said) == 1 and "no noise floor measured yet" in said[0]  # said once
    attrs = {NOISE_FLOOR: {"value": 0.02}}
    assert c.reason(values[:3], 0, attrs) is None  # fewer than min_trials results
    why = c.reason(values, 0, attrs)
    assert why.startswith("stop_when_converged: P(an unseen configuration beats the best val_acc 0.91 by more than the noise floor 0.02)")
    assert c.reason(values, 3, attrs) is None  # after an earlier stop: the window refills first (2 new results < 3)
    assert c.reason([*values, None, 0.9], 3, attrs) is not None  # (a pruned trial is no result)


NAME = "noisy-digits"
STUDY = ["name=noisy-digits", "n_trials=14", "parallel=2", "trainer.max_epochs=1", "trainer.warmup_epochs=0", "model.channels=8",
         "pruner={type: none}", "sampler={type: random}",
         "search_space={trainer.lr: {type: float, low: 3.0e-3, high: 3.0e-2, log: true}}",
         "noise_probe={seeds: 2, every: 3}", "stop_when_converged={threshold: 0.5, window: 3, min_trials: 4}"]


@pytest.mark.slow
def test_a_noise_probe_measures_the_floor_and_a_converged_study_stops(store):
    out = run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", *STUDY).stdout
    assert "noise probe: trial" in out and "stop_when_converged: P(an unseen configuration beats the best val_acc" in out
    study = optuna.load_study(study_name=NAME, storage=f"sqlite:///{store / 'optuna.db'}")
    trials = study.get_trials()
    assert len(trials) < 14  # it stopped before its budget
    probes = [t for t in trials if t.system_attrs.get("hpolab.noise_probe") is not None]
    incumbent = study.user_attrs["hpolab.noise_probes"][0]["incumbent"]
    assert len(probes) >= 2 and all(t.system_attrs["hpolab.noise_probe"] == incumbent for t in probes[:2])
    assert [t.user_attrs["hpolab.seed"] for t in probes[:2]] == [1000, 1001]
    # each probe is its incumbent again, on another seed (a later probe may measure a newer incumbent)
    assert all(t.params == trials[t.system_attrs["hpolab.noise_probe"]].params for t in probes if t.state != TrialState.WAITING), \
        [(t.number, t.state, t.params, t.system_attrs["hpolab.noise_probe"]) for t in probes]
    floor = study.user_attrs[NOISE_FLOOR]
    assert floor["source"] == "noise_probe" and floor["value"] > 0
    done = [t for t in probes if t.state == TrialState.COMPLETE]
    expected, _ = pooled_sd([[trials[incumbent].value, *[t.value for t in done]]])
    assert floor["value"] == pytest.approx(expected)
    best = max((t for t in trials if t.state == TrialState.COMPLETE and t not in probes), key=lambda t: (t.value, -t.number))
    parent = MlflowClient(f"sqlite:///{store / 'mlflow.db'}").get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.data.tags["hpolab.best_trial"] == str(best.number)  # a probe never counts as the best
    assert parent.data.tags["hpolab.stop_reason"].startswith("stop_when_converged:")
    status = run_cli("--store", str(store), "study", "status", NAME).stdout
    assert "(noise probe)" in status and "noise floor:" in status and "the noise probe:" in status
    rows = json.loads(run_cli("--store", str(store), "compare", NAME, "--format", "json").stdout)
    assert {r["trial"] for r in rows if r["noise_probe"] == "yes"} == {t.number for t in probes}
    assert [r for r in rows if r["tied"] == "best"][0]["trial"] == best.number
    again = run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", *STUDY).stdout  # stopped: nothing runs
    assert "stopped earlier: stop_when_converged" in again
    assert len(optuna.load_study(study_name=NAME, storage=f"sqlite:///{store / 'optuna.db'}").get_trials()) == len(trials)
