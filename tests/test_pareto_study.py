"""A study of two objectives with a constraint and pruning, through the real CLI: the shipped
studies/digits_pareto.yaml, shortened. One study run per module, read by every test."""

from __future__ import annotations

import json
import shutil

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from conftest import run_cli
from hpolab.study.objectives import ranking
from hpolab.study.objectives.objective_values import VALUES_ATTR

NAME = "digits-pareto"
# A quarter of the trials kept at each epoch after the first (percentile 25 keeps the top 25%): some are pruned.
ARGS = ["n_trials=8", "parallel=2", "trainer.max_epochs=3", "sampler.kwargs={population_size: 4}",
        "pruner={type: percentile, kwargs: {percentile: 25.0, n_startup_trials: 2, n_warmup_steps: 1}}"]


@pytest.fixture(scope="module")
def ran(tmp_path_factory, migrated_store):
    store = tmp_path_factory.mktemp("pareto") / "store"
    store.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, store / name)
    out = run_cli("--store", str(store), "study", "run", "studies/digits_pareto.yaml", *ARGS)
    study = optuna.load_study(study_name=NAME, storage=f"sqlite:///{store / 'optuna.db'}")
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    return store, out.stdout, study, client


@pytest.mark.slow
def test_a_two_objective_study_prunes_and_records_every_objective(ran):
    store, stdout, study, client = ran
    trials = study.get_trials()
    assert len(study.directions) == 2 and study.metric_names == ["val_acc", "latency_ms"]
    states = [t.state for t in trials]
    assert len(trials) == 8 and TrialState.PRUNED in states and TrialState.COMPLETE in states, states
    for t in trials:
        recorded = t.user_attrs[VALUES_ATTR]
        assert set(recorded) == {"val_acc", "latency_ms", "params"}  # a pruned trial's values are kept too
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.data.tags["hpolab.state"] == t.state.name
        assert run.data.metrics["latency_ms"] == pytest.approx(recorded["latency_ms"])
        assert run.data.tags["hpolab.feasible"] == ("true" if recorded["params"] <= 2.0e4 else "false")
        assert ranking.feasible(t) == (recorded["params"] <= 2.0e4)  # Optuna's own constraint
        if t.state == TrialState.COMPLETE:
            assert t.values == pytest.approx([recorded["val_acc"], recorded["latency_ms"]])
            history = client.get_metric_history(run.info.run_id, "val_acc")
            assert recorded["val_acc"] == pytest.approx(max(m.value for m in history))  # at the best epoch
        else:
            assert "hpolab.pruned_at_epoch" in run.data.tags
    # the pruner decided on a companion single-objective study that mirrors every trial's curve
    companion = optuna.load_study(study_name=NAME + "~pruning", storage=f"sqlite:///{store / 'optuna.db'}")
    mirrored = {c.user_attrs["hpolab.trial"]: c for c in companion.get_trials()}
    assert set(mirrored) == {t.number for t in trials}
    for t in trials:
        assert mirrored[t.number].state == t.state
        assert len(mirrored[t.number].intermediate_values) == int(client.get_run(t.user_attrs["mlflow_run_id"]).data.tags["hpolab.epochs_run"])
    assert "objectives val_acc (maximize), latency_ms (minimize), pruning on val_acc" in stdout


@pytest.mark.slow
def test_the_front_is_on_the_parent_run_and_in_status_and_report(ran):
    store, stdout, study, client = ran
    front = ranking.front(study.get_trials(), ranking.directions_of(study))
    assert front and all(ranking.feasible(t) for t in front)
    parent_id = study.user_attrs["mlflow_parent_run_id"]
    parent = client.get_run(parent_id)
    assert parent.data.tags["hpolab.pareto_front"] == ",".join(str(t.number) for t in front)
    knee = ranking.knee(front, ranking.directions_of(study))
    assert parent.data.tags["hpolab.best_trial"] == str(knee.number)
    saved = json.loads(open(client.download_artifacts(parent_id, "pareto_front.json", str(store))).read())
    assert [r["trial"] for r in saved["front"]] == [t.number for t in front]
    assert "hypervolume" in parent.data.metrics

    status = run_cli("--store", str(store), "study", "status", NAME).stdout
    assert "val_acc" in status and "latency_ms" in status and "knee" in status and "feasible" in status
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(run_cli("--store", str(store), "compare", NAME, "--format", "csv").stdout)))
    assert rows[0]["rank"] == "1" and rows[0]["front"] in ("yes", "knee")  # rank 1 is on the front
    assert {r["trial"] for r in rows if r["front"]} == {str(t.number) for t in front}
    assert [r["trial"] for r in rows if r["front"] == "knee"] == [str(knee.number)]
    listed = run_cli("--store", str(store), "study", "list").stdout
    assert NAME in listed and "~pruning" not in listed and "maximize/minimize" in listed
    check = run_cli("--store", str(store), "study", "check", NAME, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    report = run_cli("--store", str(store), "report", NAME, "--out", str(store / "r.html"))
    page = (store / "r.html").read_text()
    assert "Knee of the Pareto front: trial " + str(knee.number) in page and 'id="plot-pareto-front"' in page
    assert 'id="plot-learning-curves"' in page  # the epochs, from the companion study
    assert "This plot failed" not in page, report.stdout


@pytest.mark.slow
def test_promote_picks_from_the_front_by_a_stated_rule(ran, tmp_path):
    store, stdout, study, client = ran
    front = ranking.front(study.get_trials(), ranking.directions_of(study))
    fastest = min(front, key=lambda t: t.values[1])
    bad = run_cli("--store", str(store), "promote", "--no-race", NAME, "--pick", "val_acc>=1.01", cwd=tmp_path, check=False)
    assert bad.returncode == 2 and "no trial on the Pareto front meets it" in bad.stderr and "Traceback" not in bad.stderr
    refused = run_cli("--store", str(store), "promote", "--no-race", NAME, "--metric", "val_loss", cwd=tmp_path, check=False)
    assert refused.returncode == 2 and "state the choice with --pick" in refused.stderr
    out = run_cli("--store", str(store), "promote", "--no-race", NAME, "--pick", "min latency_ms", cwd=tmp_path)
    assert f"chosen by --pick min latency_ms: trial {fastest.number} " in out.stdout
    version = client.get_model_version_by_alias(NAME, "champion")
    assert version.tags["hpolab.trial_number"] == str(fastest.number)
    assert version.tags["hpolab.pick"].startswith("--pick min latency_ms: trial")


@pytest.mark.slow
def test_a_new_study_warm_starts_from_the_earlier_one(ran):
    store, stdout, study, client = ran
    storage = f"sqlite:///{store / 'optuna.db'}"
    base = ["--store", str(store), "study", "run", "studies/digits_pareto.yaml", "name=pareto-warm", "trainer.max_epochs=2", "parallel=2",
            "log_models=none"]
    # refused before the study exists: nothing is written
    for extra, msg in ((["warm_start={from: nope}"], "warm_start.from: no study named 'nope'"),
                       (["warm_start={from: digits-pareto, import_trials: true}", "objectives=null", "pruning=null", "constraints=[]",
                         "sampler={type: tpe}"], "warm_start.import_trials: study 'digits-pareto' optimised val_acc, latency_ms")):
        bad = run_cli(*base, "n_trials=2", *extra, check=False)
        assert bad.returncode == 2 and msg in bad.stderr + bad.stdout and "Traceback" not in bad.stderr, bad.stderr
        assert "pareto-warm" not in [s.study_name for s in optuna.get_all_study_summaries(storage)]
    out = run_cli(*base, "n_trials=2", "warm_start={from: digits-pareto, top_k: 2, import_trials: true}").stdout
    assert "warm start from study digits-pareto: 2 best configurations enqueued" in out
    warm = optuna.load_study(study_name="pareto-warm", storage=storage)
    source = study.get_trials()
    best2 = []  # the two best distinct configurations (NSGA-II can propose one twice)
    for t in ranking.ranked(source, ranking.directions_of(study)):
        if len(best2) < 2 and t.params not in [source[n].params for n in best2]:
            best2.append(t.number)
    own = [t for t in warm.get_trials() if not t.system_attrs.get("hpolab.imported_from")]
    imported = [t for t in warm.get_trials() if t.system_attrs.get("hpolab.imported_from")]
    assert len(own) == 2 and all(t.state == TrialState.COMPLETE for t in own)  # the budget counts its own trials only
    assert sorted(t.user_attrs["hpolab.warm_start_from"] for t in own) == sorted(f"digits-pareto trial {n}" for n in best2)
    assert [t.params for t in own] == [source[n].params for n in best2]
    assert len(imported) == sum(t.state == TrialState.COMPLETE for t in source)
    assert not {t.number for t in imported} & {t.number for t in ranking.front(warm.get_trials(), ranking.directions_of(warm))}
    parent = client.get_run(warm.user_attrs["mlflow_parent_run_id"])
    assert parent.data.tags["hpolab.warm_start"].startswith("warm start from study digits-pareto")
    check = run_cli("--store", str(store), "study", "check", "pareto-warm", check=False)
    assert check.returncode == 0, check.stdout + check.stderr  # imported trials need no run here
    again = run_cli(*base, "n_trials=2", "warm_start={from: digits-pareto, top_k: 2, import_trials: true}").stdout
    assert "warm start from" not in again and len(optuna.load_study(study_name="pareto-warm", storage=storage).get_trials()) == len(warm.get_trials())


@pytest.mark.slow
def test_delete_takes_the_companion_study_along(ran):
    store, *_ = ran
    run_cli("--store", str(store), "study", "delete", NAME, "--yes")
    names = [s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{store / 'optuna.db'}")]
    assert NAME not in names and NAME + "~pruning" not in names
