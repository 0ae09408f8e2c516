"""Retention (issue 13): `log_models` and `keep_checkpoints`, as Ray Tune's num_to_keep and
Determined's checkpoint GC. Logic on fabricated trials, then the real CLI on a tiny study."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from conftest import run_cli
from hpolab.study.retention import checkpoints_to_delete, model_skip_reason, top_k

DIST = {"x": FloatDistribution(0, 1)}


def _trial(number: int, state: TrialState, value: float | None = None, history: list[int] | None = None):
    t = create_trial(state=state, value=value, params={"x": 0.5}, distributions=DIST,
                     system_attrs={"retry_history": history} if history else {})
    t.number = number
    return t


def test_top_k_ranks_complete_trials_by_the_metric():
    trials = [_trial(0, TrialState.COMPLETE, 0.5), _trial(1, TrialState.PRUNED), _trial(2, TrialState.COMPLETE, 0.9),
              _trial(3, TrialState.COMPLETE, 0.7), _trial(4, TrialState.RUNNING)]
    assert top_k(trials, 2, "maximize") == [2, 3]
    assert top_k(trials, 2, "minimize") == [0, 3]


def test_checkpoints_kept_for_top_k_running_and_pending_retries():
    trials = [
        _trial(0, TrialState.COMPLETE, 0.5),
        _trial(1, TrialState.FAIL),  # retried as 4, which is still WAITING: 4 resumes from 1's checkpoint
        _trial(2, TrialState.FAIL),  # retried as 5, COMPLETE and best: 5's best.pt may be 2's
        _trial(3, TrialState.PRUNED),
        _trial(4, TrialState.WAITING, history=[1]),
        _trial(5, TrialState.COMPLETE, 0.9, history=[2]),
        _trial(6, TrialState.RUNNING),  # its running best is kept until it ends
        _trial(7, TrialState.COMPLETE, 0.1),
    ]
    assert [t.number for t in checkpoints_to_delete(trials, 2, "maximize")] == [3, 7]


def test_which_trials_log_a_model():
    top = {2}.__contains__
    assert model_skip_reason("complete", TrialState.COMPLETE, top, 1) is None
    assert model_skip_reason("complete", TrialState.PRUNED, top, 1)
    assert model_skip_reason("all", TrialState.PRUNED, top, 1) is None
    assert model_skip_reason("none", TrialState.COMPLETE, top, 1) == "log_models: none"

    class TopK:
        top_k = 1

    assert model_skip_reason(TopK(), TrialState.COMPLETE, top, 2) is None
    assert "top 1" in model_skip_reason(TopK(), TrialState.COMPLETE, top, 3)


@pytest.mark.parametrize("override, field", [
    ("log_models=best", "log_models"), ("log_models={top_k: 0}", "log_models"),
    ("keep_checkpoints=complete", "keep_checkpoints"), ("keep_checkpoints={top_k: two}", "keep_checkpoints"),
    ("checkpoint_upload_every=-5", "checkpoint_upload_every"),
])
def test_bad_retention_values_are_spec_errors_naming_the_field(override, field):
    out = run_cli("study", "validate", "studies/digits_cnn.yaml", override, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"  - {field}: " in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


ARGS = ["studies/digits_cnn.yaml", "name=keep", "n_trials=4", "parallel=1", "trainer.max_epochs=3",
        "pruner={type: none}", "sampler={type: random}"]


def _runs(store: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    study = optuna.load_study(study_name="keep", storage=f"sqlite:///{store / 'optuna.db'}")
    exp = client.get_experiment_by_name("keep")
    runs = {t.number: client.get_run(t.user_attrs["mlflow_run_id"]) for t in study.get_trials()}
    return client, study, exp, runs


@pytest.mark.slow
def test_top_k_keeps_the_best_models_and_checkpoints_only(store):
    run_cli("--store", str(store), "study", "run", *ARGS, "log_models={top_k: 1}", "keep_checkpoints={top_k: 2}",
            "checkpoint_upload_every=0")  # last.pt uploaded after every epoch: deleted with best.pt
    client, study, exp, runs = _runs(store)
    ranked = top_k(study.get_trials(), 4, "maximize")
    best, second, rest = ranked[0], ranked[1], ranked[2:]
    live = client.search_logged_models([exp.experiment_id])
    assert [m.source_run_id for m in live] == [runs[best].info.run_id]
    assert [p for p in (store / "artifacts" / "models").rglob("*") if p.is_file() and live[0].model_id not in str(p)] == []
    for n in (best, second):
        assert (store / "trials" / "keep" / f"trial-{n}" / "best.pt").exists()
        names = [a.path for a in client.list_artifacts(runs[n].info.run_id, "checkpoints")]
        assert "checkpoints/best.pt" in names and "checkpoints/last.pt" in names
    for n in rest:
        folder = store / "trials" / "keep" / f"trial-{n}"
        assert not (folder / "last.pt").exists() and not (folder / "best.pt").exists()
        assert (folder / "config.yaml").exists()
        assert client.list_artifacts(runs[n].info.run_id, "checkpoints") == []
        assert runs[n].data.tags["hpolab.checkpoints_deleted"] == "keep_checkpoints: top_k 2"
        tags = runs[n].data.tags
        assert "hpolab.model_deleted" in tags or "hpolab.model_skipped" in tags
    assert all(r.info.status == "FINISHED" for r in runs.values())


@pytest.mark.slow
def test_log_models_none_logs_no_model_and_all_keeps_every_checkpoint(store):
    run_cli("--store", str(store), "study", "run", *ARGS, "n_trials=2", "log_models=none")
    client, study, exp, runs = _runs(store)
    assert client.search_logged_models([exp.experiment_id]) == []
    assert all(r.data.tags["hpolab.model_skipped"] == "log_models: none" for r in runs.values())
    assert all((store / "trials" / "keep" / f"trial-{n}" / "last.pt").exists() for n in runs)
