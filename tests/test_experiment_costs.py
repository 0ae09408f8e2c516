"""An experiment's own cost metric (COSTS + costs(model, example)) as an objective, in a project
outside the repository, with a model that is not a classifier (the diabetes regression MLP):
refused when declared wrong, measured after training when right, ranked and gated at promote."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import ROOT, copy_store, open_study, run_cli
from hpolab.config.spec import load_spec
from hpolab.errors import SpecError
from hpolab.study.objectives.objective_values import VALUES_ATTR

NAME = "diabetes-cost"
COSTS = '''

COSTS = {"mmacs": "minimize"}  # the experiment's own cost metric: multiply-accumulates per sample, in millions


def costs(model, example):
    macs = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    return {"mmacs": macs / 1e6}
'''
SPEC = """name: diabetes-cost
experiment: diabetes_cost
objectives:
  - {metric: val_rmse, direction: minimize}
  - {metric: mmacs, direction: minimize}
n_trials: 3
parallel: 1
seed: 0
sampler: {type: random}
pruner: {type: none}
trainer: {max_epochs: 2, batch_size: 32, lr: 3.0e-3, regression_loss: mse, standardize_targets: true}
model: {width: 64, depth: 2, dropout: 0.0}
search_space:
  model.width: {type: categorical, choices: [8, 32, 128]}
"""


def _project(root: Path, costs: str = COSTS) -> Path:
    (root / "experiments").mkdir(parents=True)
    (root / "studies").mkdir()
    src = (ROOT / "experiments" / "diabetes_mlp.py").read_text()
    (root / "experiments" / "diabetes_cost.py").write_text(src + costs)
    (root / "studies" / "cost.yaml").write_text(SPEC)
    return root / "studies" / "cost.yaml"


@pytest.mark.parametrize("costs, override, expected", [
    ('\nCOSTS = {"mmacs": "minimize"}\n', [], "COSTS is declared but there is no costs(model, example)"),
    ('\nCOSTS = {"mmacs": "smaller"}\n', [], "COSTS must map each cost metric's name to maximize or minimize"),
    ('\nCOSTS = {"latency_ms": "minimize"}\ndef costs(m, x):\n    return {}\n', [], "'latency_ms' is already a built-in cost"),
    ('\nCOSTS = {"mmacs@224": "minimize"}\ndef costs(m, x):\n    return {}\n', [], "'mmacs@224' is not a usable metric name"),
    (COSTS, ["objectives=[{metric: val_rmse, direction: minimize}, {metric: mmacs, direction: maximize}]"],
     "objectives.1.direction: mmacs should be minimized"),
    (COSTS, ["objectives=[{metric: mmacs, direction: minimize}, {metric: val_rmse, direction: minimize}]"],
     "pruning.metric: mmacs is the experiment's cost metric"),
])
def test_a_wrong_cost_declaration_is_refused_naming_it(tmp_path, costs, override, expected):
    with pytest.raises(SpecError) as e:
        load_spec(_project(tmp_path, costs), override)
    assert expected in str(e.value)


def test_a_constraint_on_the_experiments_cost_is_measured(tmp_path):
    from hpolab.config.experiment import load_experiment

    spec = load_spec(_project(tmp_path), ["constraints=[{metric: mmacs, max: 0.01}]"])
    cfg = spec.resolved_config(load_experiment("diabetes_cost", tmp_path / "studies"))
    assert cfg["cost_metrics"] == ["mmacs"]


def test_an_experiments_cost_that_returns_no_number_fails_with_its_name():
    import torch

    from hpolab.train.costs import cost_metrics

    with pytest.raises(ValueError, match="returned None for 'mmacs'"):
        cost_metrics(["mmacs"], torch.nn.Linear(2, 1), torch.zeros(1, 2), torch.device("cpu"), lambda m, x: {})
    with pytest.raises(ValueError, match="no costs.model, example. function to measure mmacs"):
        cost_metrics(["mmacs"], torch.nn.Linear(2, 1), torch.zeros(1, 2), torch.device("cpu"))


def test_the_trial_process_knows_the_same_built_in_cost_metrics_as_the_spec():
    from hpolab.config.objectives import COST_METRICS
    from hpolab.train.costs import BUILT_IN

    assert set(BUILT_IN) == set(COST_METRICS)


@pytest.fixture(scope="module")
def ran(tmp_path_factory, migrated_store):
    project = tmp_path_factory.mktemp("cost-project")
    spec = _project(project)
    store = project / "store"
    store.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, store / name)
    run_cli("--store", str(store), "study", "run", str(spec), cwd=project)
    return project, store


@pytest.mark.slow
def test_the_experiments_cost_is_an_objective_and_promote_gates_on_it(ran, tmp_path):
    project, store = ran
    client, study = open_study(store, NAME)
    assert study.metric_names == ["val_rmse", "mmacs"]
    trials = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert len(trials) == 3
    for t in trials:
        width = t.params["model.width"]
        expected = (10 * width + width * width + width * 1) / 1e6  # the MLP's Linear layers (10 features, depth 2)
        assert t.values[1] == pytest.approx(expected) and t.user_attrs[VALUES_ATTR]["mmacs"] == pytest.approx(expected)
        assert client.get_run(t.user_attrs["mlflow_run_id"]).data.metrics["mmacs"] == pytest.approx(expected)

    store2 = copy_store(store, tmp_path / "store")  # promote writes; the module's store stays as it ran
    client2, _ = open_study(store2, NAME)
    first = run_cli("--store", str(store2), "promote", "--no-race", NAME, "--pick", "min mmacs", cwd=tmp_path)
    assert "every objective" in first.stdout and "does not exist yet" in first.stdout
    v1 = client2.get_model_version_by_alias(NAME, "champion")
    small = min(trials, key=lambda t: t.values[1])
    assert v1.tags["hpolab.trial_number"] == str(small.number)
    assert float(v1.tags["hpolab.objective.mmacs"]) == pytest.approx(small.values[1])
    assert float(v1.tags["hpolab.objective.val_rmse"]) == pytest.approx(float(v1.tags["hpolab.test_rmse"]))

    second = run_cli("--store", str(store2), "promote", "--no-race", NAME, "--pick", "min val_rmse", cwd=tmp_path, check=False)
    accurate = min(trials, key=lambda t: t.values[0])
    if accurate.number == small.number:
        assert second.returncode == 0 and "already version 1" in second.stdout
        return
    assert "mmacs (minimize): challenger" in second.stdout and ", champion " in second.stdout
    # the challenger uses more compute: it gets the alias only by a lower test rmse than the champion's
    v2 = client2.get_model_version_by_alias(NAME, "champion")
    if second.returncode == 0:
        assert "worse on mmacs" in second.stdout and float(v2.tags["hpolab.test_rmse"]) < float(v1.tags["hpolab.test_rmse"])
    else:
        assert second.returncode == 3 and "on no objective" in second.stdout and v2.version == v1.version
