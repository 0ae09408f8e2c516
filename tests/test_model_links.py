"""Each trial's logged model is named after its study and trial and carries the metrics of the epoch
it was saved from, its sampled params and its rank, so `mlflow.search_logged_models` (and the
Models tab) sort and filter models the way runs are. The real CLI on tiny studies."""

from __future__ import annotations

from pathlib import Path

import mlflow
import optuna
import pytest
from mlflow import MlflowClient

from conftest import FAULT_PROJECT, run_cli
from hpolab.stores.model_links import serving_model_name, trial_model_name
from hpolab.study.objectives import ranking

ARGS = ["studies/digits_cnn.yaml", "name=links", "n_trials=3", "parallel=1", "trainer.max_epochs=2",
        "pruner={type: none}", "sampler={type: random}", "log_models=all"]


def test_model_names_replace_what_mlflow_refuses_and_mlflow_accepts_them():
    from mlflow.utils.validation import _validate_logged_model_name

    assert trial_model_name("digits-cnn", 23) == "digits-cnn-trial-23"
    assert trial_model_name("a/b.c:d%e'f\"g", 0) == "a-b-c-d-e-f-g-trial-0"
    assert serving_model_name("digits.cnn", 3) == "digits-cnn-v3"
    for name in (trial_model_name("a/b.c:d%e'f\"g", 0), serving_model_name("x:y", 1)):
        _validate_logged_model_name(name)  # raises on a character MLflow refuses


def _study(store: Path, name: str):
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{store / 'optuna.db'}")
    exp = client.get_experiment_by_name(name)
    return client, study, exp


def _metric(model, key: str) -> float:
    values = [m.value for m in model.metrics or [] if m.key == key]
    assert len(values) == 1, (model.name, key, model.metrics)
    return values[0]


@pytest.fixture(scope="module")
def links_store(tmp_path_factory, migrated_store) -> Path:
    """One tiny study, every trial's model logged (read by the tests below; `study check` ones write last)."""
    import shutil

    store = tmp_path_factory.mktemp("links") / "store"
    store.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, store / name)
    run_cli("--store", str(store), "study", "run", *ARGS)
    return store


@pytest.mark.slow
def test_trial_models_are_named_and_carry_metrics_and_params(links_store):
    client, study, exp = _study(links_store, "links")
    trials = {t.number: t for t in study.get_trials()}
    models = {m.name: m for m in client.search_logged_models([exp.experiment_id])}
    assert sorted(models) == sorted(trial_model_name("links", n) for n in trials)
    for n, t in trials.items():
        model = models[trial_model_name("links", n)]
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert model.source_run_id == run.info.run_id
        assert model.tags["hpolab.trial_number"] == str(n) and model.tags["optuna.study"] == "links"
        assert model.tags["hpolab.state"] == "COMPLETE"
        assert _metric(model, "val_acc") == t.value  # the objective: val_acc of the best epoch
        best = int(run.data.tags["hpolab.best_epoch"])
        at_best = {m.key: m.value for m in client.get_metric_history(run.info.run_id, "val_loss") if m.step == best}
        assert _metric(model, "val_loss") == at_best["val_loss"]
        assert {m.dataset_name for m in model.metrics if m.key.startswith("val_")} == {"val"}
        for key, value in t.params.items():  # the sampled params, as the run has them
            assert model.params[key] == run.data.params[key], key
        # the run's own history gained no second point at the best epoch
        assert [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")] == [1, 2]


@pytest.mark.slow
def test_trial_models_are_tagged_with_their_rank(links_store):
    client, study, exp = _study(links_store, "links")
    order = [t.number for t in ranking.ranked(study.get_trials(), "maximize")]
    ranks = {m.name: m.tags.get("hpolab.rank") for m in client.search_logged_models([exp.experiment_id])}
    assert ranks == {trial_model_name("links", n): str(i + 1) for i, n in enumerate(order)}


@pytest.mark.slow
def test_search_logged_models_filters_and_sorts_by_a_linked_metric(links_store):
    client, study, exp = _study(links_store, "links")
    values = sorted(t.value for t in study.get_trials())
    cut = values[0]  # every trial but the worst (ties included)
    mlflow.set_tracking_uri(f"sqlite:///{links_store / 'mlflow.db'}")
    try:  # (the fluent API reads the global URI, which set_tracking_uri also exports to os.environ)
        found = mlflow.search_logged_models(experiment_ids=[exp.experiment_id], filter_string=f"metrics.val_acc > {cut}",
                                            order_by=[{"field_name": "metrics.val_acc", "ascending": False}], output_format="list")
    finally:
        mlflow.set_tracking_uri(None)
    expected = [t.number for t in ranking.ranked(study.get_trials(), "maximize") if t.value > cut]
    assert expected, "every trial tied on val_acc: the filter would select nothing and prove nothing"
    assert [m.name for m in found] == [trial_model_name("links", n) for n in expected]


@pytest.mark.slow
def test_several_objectives_link_every_objective_and_tag_the_front(store):
    out = run_cli("--store", str(store), "study", "run", "studies/fixed_point.yaml", "log_models=all",
                  cwd=FAULT_PROJECT, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    client, study, exp = _study(store, "fixed-point")
    directions = ranking.directions_of(study)
    on_front = {t.number for t in ranking.front(study.get_trials(), directions)}
    assert on_front  # fixed_point.yaml: trials 1 and 2
    models = {m.tags["hpolab.trial_number"]: m for m in client.search_logged_models([exp.experiment_id])}
    assert sorted(models) == sorted(str(t.number) for t in study.get_trials())
    for t in study.get_trials():
        model = models[str(t.number)]
        assert model.name == trial_model_name("fixed-point", t.number)
        assert [_metric(model, "val_a"), _metric(model, "val_b")] == t.values
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert _metric(model, "val_c") == run.data.metrics["val_c"]  # the constrained metric (one epoch)
        assert model.tags["hpolab.on_front"] == ("true" if t.number in on_front else "false")
        assert (model.tags["hpolab.pareto_rank"] == "0") == (t.number in on_front)
    out = run_cli("--store", str(store), "study", "check", "fixed-point", cwd=FAULT_PROJECT, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_promote_names_the_serving_model_and_links_the_test_metrics_to_it_and_the_trial_model(links_store, tmp_path):
    import shutil

    store = tmp_path / "store"
    shutil.copytree(links_store, store)
    out = run_cli("--store", str(store), "promote", "--no-race", "links", check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    client, study, exp = _study(store, "links")
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}", registry_uri=f"sqlite:///{store / 'mlflow.db'}")
    version = client.get_model_version_by_alias("links", "champion")
    serving = client.get_logged_model(version.source.removeprefix("models:/"))
    assert serving.name == serving_model_name("links", version.version)
    promote_run = client.get_run(serving.source_run_id)
    tests = {k: v for k, v in promote_run.data.metrics.items() if k.startswith("test_")}
    assert "test_acc" in tests
    best = ranking.best(study.get_trials(), "maximize")
    trial_model = client.get_logged_model(client.get_run(best.user_attrs["mlflow_run_id"]).data.tags["hpolab.model_id"])
    for model in (serving, trial_model):
        linked = {m.key: m.value for m in model.metrics if m.key.startswith("test_")}
        assert linked == tests, model.name
        assert {m.dataset_name for m in model.metrics if m.key.startswith("test_")} == {"test"}
    out = run_cli("--store", str(store), "study", "check", "links", check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_serving_model_is_named_after_the_version_the_registry_gives_next(store):
    from hpolab.registry.writer import next_version

    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert next_version(client, "nm") == 1  # no such registered model yet
    client.create_registered_model("nm")
    assert next_version(client, "nm") == 1
    for _ in range(11):  # numerically: version 11 is after version 9
        client.create_model_version("nm", source=str(store / "artifacts"))
    assert next_version(client, "nm") == 12


@pytest.mark.slow
def test_study_check_finds_an_unlinked_objective_and_a_tag_naming_a_deleted_model(links_store, tmp_path):
    import shutil
    import sqlite3

    store = tmp_path / "store"
    shutil.copytree(links_store, store)
    out = run_cli("--store", str(store), "study", "check", "links", check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    client, study, exp = _study(store, "links")
    first, second = study.get_trials()[:2]
    model_id = client.get_run(first.user_attrs["mlflow_run_id"]).data.tags["hpolab.model_id"]
    with sqlite3.connect(store / "mlflow.db") as con:  # MLflow has no call that unlinks a metric
        con.execute("DELETE FROM logged_model_metrics WHERE model_id = ? AND metric_name = 'val_acc'", (model_id,))
    out = run_cli("--store", str(store), "study", "check", "links", check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"its logged model {model_id} has val_acc=None linked" in out.stdout, out.stdout
    out = run_cli("--store", str(store), "study", "check", "links", "--repair", check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert _metric(client.get_logged_model(model_id), "val_acc") == first.value

    gone = client.get_run(second.user_attrs["mlflow_run_id"]).data.tags["hpolab.model_id"]
    client.delete_logged_model(gone)  # by hand: its run still names it, unmarked
    out = run_cli("--store", str(store), "study", "check", "links", check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"names logged model {gone}, which is missing" in out.stdout, out.stdout


def _fabricated(number: int, values, state="COMPLETE", constraints=None):
    from types import SimpleNamespace

    return SimpleNamespace(number=number, state=state, values=values, system_attrs={}, constraints=constraints or {})


def test_rank_tags_follow_ranking_for_one_and_several_objectives():
    from hpolab.study.objectives.ranking import rank_tags

    one = [_fabricated(0, [0.5]), _fabricated(1, [0.9]), _fabricated(2, None, "PRUNED"), _fabricated(3, [0.7])]
    order = [t.number for t in ranking.ranked(one, "maximize")]
    tags = rank_tags(one, "maximize")
    assert {n: tags[n]["hpolab.rank"] for n in order} == {n: str(i + 1) for i, n in enumerate(order)}
    assert tags[2] == {"hpolab.rank": None, "hpolab.pareto_rank": None, "hpolab.on_front": None}  # PRUNED: none

    # minimize both: 0 infeasible (it dominates 1); front 1, 2; 3 dominated by 2
    several = [_fabricated(0, [5.0, 0.0], constraints={"c": 1.0}), _fabricated(1, [6.0, 1.0]),
               _fabricated(2, [0.0, 10.0]), _fabricated(3, [1.0, 11.0])]
    tags = rank_tags(several, ["minimize", "minimize"])
    front = {t.number for t in ranking.front(several, ["minimize", "minimize"])}
    assert {n for n, t in tags.items() if t["hpolab.on_front"] == "true"} == front
    assert {n for n, t in tags.items() if t["hpolab.pareto_rank"] == "0"} == front
    assert tags[0]["hpolab.pareto_rank"] == "infeasible" and tags[3]["hpolab.pareto_rank"] == "1"


def test_a_rank_pass_skips_a_model_deleted_since_its_search(store, monkeypatch):
    """Another worker's retention may delete a model between the pass's search and its tag write."""
    from hpolab.stores import model_links
    from hpolab.study.objectives.ranking import apply_rank_tags

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = client.create_experiment("s", artifact_location=(store / "artifacts").as_uri())
    gone, kept = (client.create_logged_model(exp, name=trial_model_name("s", n), tags={"optuna.study": "s", "hpolab.trial_number": str(n)})
                  for n in (0, 1))
    searched = model_links.study_models

    def search_then_delete(client, experiment_id):
        found = searched(client, experiment_id)
        client.delete_logged_model(gone.model_id)
        return found
    monkeypatch.setattr(model_links, "study_models", search_then_delete)
    assert apply_rank_tags(client, exp, "s", {0: {"hpolab.rank": "2"}, 1: {"hpolab.rank": "1"}}) == 1
    assert client.get_logged_model(kept.model_id).tags["hpolab.rank"] == "1"
