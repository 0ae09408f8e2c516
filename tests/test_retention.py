"""Retention: `log_models` and `keep_checkpoints`, as Ray Tune's num_to_keep and
Determined's checkpoint GC. Logic on fabricated trials, then the real CLI on a tiny study."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from mlflow import MlflowClient
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from conftest import run_cli
from hpolab.study.retention.retention import checkpoints_to_delete, model_skip_reason, top_k

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
    assert (live[0].name, live[0].tags["hpolab.rank"]) == (f"keep-trial-{best}", "1")  # ranked after the others finished
    for run in runs.values():  # a run naming a deleted model says so: no unmarked pointer at it
        model_id = run.data.tags.get("hpolab.model_id")
        assert model_id is None or model_id == live[0].model_id or "hpolab.model_deleted" in run.data.tags
    assert run_cli("--store", str(store), "study", "check", "keep", check=False).returncode == 0
    for n in (best, second):  # best.pt once, in the artifact store; last.pt gone with the trial's end
        folder = store / "trials" / "keep" / f"trial-{n}"
        assert not (folder / "best.pt").exists() and not (folder / "last.pt").exists()
        names = [a.path for a in client.list_artifacts(runs[n].info.run_id, "checkpoints")]
        assert names == ["checkpoints/best.pt"]
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
    run_cli("--store", str(store), "study", "run", *ARGS, "n_trials=2", "log_models=none", "keep_checkpoints=all")
    client, study, exp, runs = _runs(store)
    assert client.search_logged_models([exp.experiment_id]) == []
    assert all(r.data.tags["hpolab.model_skipped"] == "log_models: none" for r in runs.values())
    for n, run in runs.items():  # every best.pt kept, once (artifact store); no last.pt once finished
        assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")] == ["checkpoints/best.pt"]
        assert not any((store / "trials" / "keep" / f"trial-{n}" / name).exists() for name in ("last.pt", "best.pt"))


# ---------------------------------------------------------------- the default retention

DEFAULTS = ["studies/digits_cnn.yaml", "name=keep", "n_trials=7", "parallel=2", "trainer.max_epochs=1",
            "pruner={type: none}", "sampler={type: random}", "checkpoint_upload_every=0"]


@pytest.fixture(scope="module")
def defaults_store(tmp_path_factory, migrated_store) -> Path:
    """One study of 7 one-epoch trials with the default retention (top 5), shared by the tests below
    (they only read it, or promote: the last test of the module to write)."""
    import shutil

    store = tmp_path_factory.mktemp("defaults") / "store"
    store.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, store / name)
    run_cli("--store", str(store), "study", "run", *DEFAULTS)
    return store


@pytest.mark.slow
def test_default_retention_keeps_the_top_5_best_pt_once_and_no_last_pt(defaults_store):
    store = defaults_store
    client, study, exp, runs = _runs(store)
    ranked = top_k(study.get_trials(), 7, "maximize")
    assert len(ranked) == 7
    live = client.search_logged_models([exp.experiment_id])
    assert sorted(m.source_run_id for m in live) == sorted(runs[n].info.run_id for n in ranked[:5])
    for n in ranked:
        run_id, folder = runs[n].info.run_id, store / "trials" / "keep" / f"trial-{n}"
        assert not (folder / "last.pt").exists() and not (folder / "best.pt").exists()  # best.pt: artifact store only
        assert (folder / "config.yaml").exists()  # reproduce needs only the config
        assert runs[n].data.tags["hpolab.last_checkpoint"] == "deleted when the trial finished"
        names = [a.path for a in client.list_artifacts(run_id, "checkpoints")]
        if n in ranked[:5]:
            assert names == ["checkpoints/best.pt"], (n, names)
        else:
            assert names == [] and runs[n].data.tags["hpolab.checkpoints_deleted"] == "keep_checkpoints: top_k 5"
    # study check: a checkpoint deleted on purpose (retention, or last.pt at the end) is no defect
    out = run_cli("--store", str(store), "study", "check", "keep", check=False)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_promote_of_a_top_k_trial_works_and_retention_keeps_a_promoted_trial(defaults_store):
    from types import SimpleNamespace

    from hpolab.study.retention.retention import Retention

    store = defaults_store
    out = run_cli("--store", str(store), "promote", "--no-race", "keep", check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    client, study, exp, runs = _runs(store)
    best = top_k(study.get_trials(), 1, "maximize")[0]
    run_id = runs[best].info.run_id
    assert client.get_model_version_by_alias("keep", "champion").tags.get("hpolab.trial_run_id") == run_id
    # Whatever its rank later, a promoted trial's checkpoints are not deleted by retention.
    spec = SimpleNamespace(log_models="complete", keep_checkpoints=SimpleNamespace(top_k=1), direction="maximize")
    folder = store / "trials" / "keep" / f"trial-{best}"
    Retention(spec, study, lambda n: folder).purge(client, [("checkpoints", best, run_id, folder)])
    assert [a.path for a in client.list_artifacts(run_id, "checkpoints")] == ["checkpoints/best.pt"]
    assert "hpolab.checkpoints_deleted" not in client.get_run(run_id).data.tags


@pytest.mark.slow
def test_prune_files_says_what_it_deletes_and_deletes_only_with_yes(store):
    """A store made before the default retention (`keep_checkpoints: all`, every model, a last.pt and
    a best.pt in each trial folder): prune-files lists, asks (no terminal: deletes nothing), then
    deletes with --yes what the default retention would not keep; study check finds no problem."""
    import shutil

    run_cli("--store", str(store), "study", "run", *ARGS, "n_trials=3", "trainer.max_epochs=1",
            "keep_checkpoints=all", "log_models=complete")
    client, study, exp, runs = _runs(store)
    for n, run in runs.items():  # what the old code left in every trial folder
        best = Path(client.download_artifacts(run.info.run_id, "checkpoints/best.pt", str(store / f"dl-{n}")))
        folder = store / "trials" / "keep" / f"trial-{n}"
        shutil.copy(best, folder / "best.pt")
        shutil.copy(best, folder / "last.pt")
        shutil.rmtree(store / f"dl-{n}")
    ranked = top_k(study.get_trials(), 3, "maximize")
    before = {p: p.stat().st_size for p in (store / "trials").rglob("*.pt")}

    out = run_cli("--store", str(store), "study", "prune-files", "keep", "--keep", "1", check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "checkpoints (last.pt, best.pt) of 2 finished trials outside the top 1" in out.stdout, out.stdout
    assert "logged models of 2 COMPLETE trials outside the top 1" in out.stdout, out.stdout
    assert "nothing deleted: pass --yes" in out.stdout, out.stdout
    assert {p: p.stat().st_size for p in (store / "trials").rglob("*.pt")} == before

    out = run_cli("--store", str(store), "study", "prune-files", "keep", "--keep", "1", "--yes")
    assert "deleted" in out.stdout.splitlines()[-1], out.stdout
    assert list((store / "trials").rglob("*.pt")) == []  # top 1: best.pt in the artifact store only
    client, study, exp, runs = _runs(store)
    assert [a.path for a in client.list_artifacts(runs[ranked[0]].info.run_id, "checkpoints")] == ["checkpoints/best.pt"]
    assert [m.source_run_id for m in client.search_logged_models([exp.experiment_id])] == [runs[ranked[0]].info.run_id]
    for n in ranked[1:]:
        assert client.list_artifacts(runs[n].info.run_id, "checkpoints") == []
    out = run_cli("--store", str(store), "study", "check", "keep", check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    out = run_cli("--store", str(store), "study", "prune-files", "keep", "--keep", "1")
    assert "nothing to delete" in out.stdout, out.stdout


def test_retention_leaves_a_pending_retry_resumable_on_another_worker(store, tmp_path):
    """Real stores, fabricated trials: worker 1 ran trials 0-2 (2 died after uploading its last.pt;
    its retry 3 waits). Retention (top 1) deletes trial 1's files but not 2's, and worker 2, which
    cannot see worker 1's trial folders, still resumes trial 3 from the uploaded checkpoint."""
    import torch

    from hpolab.stores.paths import Stores
    from hpolab.study.retention.retention import Retention
    from hpolab.study.state.retry import retry_source

    uri, optuna_url = f"sqlite:///{store / 'mlflow.db'}", f"sqlite:///{store / 'optuna.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("keep", artifact_location=(store / "artifacts").as_uri())
    study = optuna.create_study(study_name="keep", storage=optuna_url, direction="maximize")
    w1 = Stores(store, optuna_url, uri, (store / "artifacts").as_uri())
    for n, (state, value, status) in enumerate([(TrialState.COMPLETE, 0.9, "FINISHED"), (TrialState.COMPLETE, 0.5, "FINISHED"),
                                                (TrialState.FAIL, None, "FAILED")]):
        run_id = client.create_run(exp).info.run_id
        folder = w1.trial_dir("keep", n)
        folder.mkdir(parents=True)
        torch.save({"epoch": 1, "model": {"w": torch.zeros(2)}}, folder / "last.pt")
        client.log_artifact(run_id, str(folder / "last.pt"), "checkpoints")
        client.set_terminated(run_id, status)
        study.add_trial(optuna.trial.create_trial(state=state, value=value, params={"x": 0.5}, distributions=DIST,
                                                  user_attrs={"mlflow_run_id": run_id}))
    study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING, params={"x": 0.5}, distributions=DIST,
                                              system_attrs={"retry_history": [2], "failed_trial": 2}))
    spec = SimpleNamespace(log_models="complete", keep_checkpoints=SimpleNamespace(top_k=1), direction="maximize")
    retention = Retention(spec, study, lambda n: w1.trial_dir("keep", n))
    # The runs as another worker made them: not in this process's artifact-repository cache. The purge
    # reads them in one search and takes their artifact URIs from it: no run read back one by one.
    from mlflow.tracking._tracking_service import utils

    utils._artifact_repos_cache.clear()
    read_back = []
    get_run = client._tracking_client.get_run
    client._tracking_client.get_run = lambda run_id: read_back.append(run_id) or get_run(run_id)
    retention.purge(client, retention.plan(), exp)
    del client._tracking_client.get_run
    assert read_back == []
    runs = [t.user_attrs["mlflow_run_id"] for t in study.get_trials()[:3]]
    assert client.list_artifacts(runs[1], "checkpoints") == [] and not (w1.trial_dir("keep", 1) / "last.pt").exists()
    assert [a.path for a in client.list_artifacts(runs[2], "checkpoints")] == ["checkpoints/last.pt"]

    w2 = Stores(tmp_path / "w2", optuna_url, uri, (store / "artifacts").as_uri())
    src = retry_source(study, w2, "keep", 3)
    assert src.tags["hpolab.resume_source"] == "artifact" and src.tags["hpolab.resumed_from"] == f"runs:/{runs[2]}/checkpoints/last.pt"
    assert torch.load(src.resume_from, weights_only=True)["epoch"] == 1


@pytest.mark.slow
def test_retention_keeps_the_files_of_a_front_trial_an_infeasible_one_dominates(store):
    """Minimize val_a and val_b, val_c <= 0 (tests/fault_project/studies/fixed_point.yaml): trial 0
    (infeasible) dominates trial 1; trial 2 dominates trial 3. The feasible front is trials 1 and 2:
    top_k 2 keeps their models and best.pt, and `promote --pick` can take trial 1."""
    from conftest import FAULT_PROJECT

    out = run_cli("--store", str(store), "study", "run", "studies/fixed_point.yaml", "log_models={top_k: 2}",
                  "keep_checkpoints={top_k: 2}", cwd=FAULT_PROJECT, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    study = optuna.load_study(study_name="fixed-point", storage=f"sqlite:///{store / 'optuna.db'}")
    assert [t.params["model.point"] for t in study.get_trials()] == ["x", "f", "h", "g"]
    runs = {t.number: client.get_run(t.user_attrs["mlflow_run_id"]) for t in study.get_trials()}
    live = {m.source_run_id for m in client.search_logged_models([runs[0].info.experiment_id])}
    assert live == {runs[1].info.run_id, runs[2].info.run_id}
    for n in (1, 2):
        assert [a.path for a in client.list_artifacts(runs[n].info.run_id, "checkpoints")] == ["checkpoints/best.pt"]
    for n in (0, 3):
        assert client.list_artifacts(runs[n].info.run_id, "checkpoints") == []
    out = run_cli("--store", str(store), "promote", "--no-race", "fixed-point", "--pick", "max val_a", cwd=FAULT_PROJECT, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "trial 1 of 2 on the front (1, 2)" in out.stdout + out.stderr, out.stdout + out.stderr


def test_prune_files_counts_a_hard_linked_best_pt_once(tmp_path):
    """best.pt is a hard link to its epoch's last.pt: the space prune-files says it frees counts that file once."""
    from hpolab.study.retention.prune_files import _local_sizes

    (tmp_path / "last.pt").write_bytes(b"x" * 1000)
    os.link(tmp_path / "last.pt", tmp_path / "best.pt")
    (tmp_path / "fetched").mkdir()
    (tmp_path / "fetched" / "last.pt").write_bytes(b"y" * 10)
    assert sorted(_local_sizes(tmp_path)) == [10, 1000]
