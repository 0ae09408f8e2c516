"""MLflow requests per trial are bounded: epochs are batched, not one round trip each.

End to end: a real `mlflow server` on loopback (its access log counts the requests), one study of a
1-epoch trial and one of a 6-epoch trial: with a flush interval longer than the trials, both make
the same number of requests, endpoint by endpoint, and every epoch's metrics still arrive. With the
default interval a run makes at most one metrics write per interval plus one at its end.
The batching itself is tested on its own below.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import time

import pytest
from mlflow import MlflowClient

from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, run_cli
from services import free_port, wait_for_http

REQUEST = re.compile(r'"(GET|POST|PUT|PATCH|DELETE) (/[^ ?"]*)')


def test_epochs_share_a_batch_until_the_interval_passes():
    from hpolab.study.trials.metric_batches import MetricBatches

    b = MetricBatches(flush_s=0.3)
    b.start("r")
    b.add("r", 1, {"val_acc": 0.5, "lr": 0.1})
    assert not b.due("r")  # just started: wait for more epochs
    b.add("r", 2, {"val_acc": 0.6, "lr": 0.1})
    assert not b.due("r")
    time.sleep(0.35)
    assert [m.key for m in b.add("r", 3, {"val_acc": 0.7, "note": "not a number"})] == ["val_acc"]
    assert b.due("r")  # due: one write for three epochs
    batch = b.take("r")
    assert [(m.key, m.step) for m in batch] == [("val_acc", 1), ("lr", 1), ("val_acc", 2), ("lr", 2), ("val_acc", 3)]
    b.add("r", 4, {"val_acc": 0.8})
    assert not b.due("r")  # the interval starts again at the write
    assert [m.step for m in b.take("r")] == [4] and b.take("r") == []
    b.add("new", 1, {"x": 1.0})
    assert b.due("new")  # a run never started here: written at once
    assert MetricBatches(flush_s=0).due("r")  # 0: every epoch its own write


def test_model_links_from_the_points_logged_match_the_history_read_back():
    from mlflow.entities import Metric

    from hpolab.stores.model_links import points_at

    logged = [Metric("val_acc", 0.5, 1, 1), Metric("lr", 0.1, 1, 1), Metric("val_acc", 0.7, 2, 2),
              Metric("val_acc", 0.71, 3, 2), Metric("params_m", 0.3, 4, 3), Metric("lr", 0.2, 2, 2)]
    got = {(m.key, m.step, m.value) for m in points_at(logged, 2, {"params_m", "lr"})}
    # epoch 2's points (the last of a key logged twice), plus an objective measured after training
    assert got == {("val_acc", 2, 0.71), ("lr", 2, 0.2), ("params_m", 3, 0.3)}


@pytest.fixture()
def mlflow_server(tmp_path):
    """`mlflow server` (SQLite backend, served artifacts) with its access log in a file."""
    port = free_port()
    log = tmp_path / "access.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
             "--artifacts-destination", (tmp_path / "server-artifacts").as_uri(), "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1"],
            stdout=out, stderr=subprocess.STDOUT, env={**hpolab_env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for_http(f"{url}/health", proc)
            yield url, log
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def requests_in(log, start: int) -> collections.Counter:
    """Requests by (method, endpoint) in the access log after byte `start` (ids folded away)."""
    text = log.read_text()[start:]
    out = collections.Counter()
    for method, path in REQUEST.findall(text):
        if path == "/health":
            continue
        path = re.sub(r"/[0-9a-f]{32}(?=/|$)", "/<id>", path)
        out[(method, re.sub(r"(/mlflow-artifacts/artifacts/).*", r"\1...", path))] += 1
    return out


def _study(store, url, name: str, epochs: int, log, flush_s: str, trials: int = 1, models: str = "none") -> collections.Counter:
    start = len(log.read_text())
    env = {**hpolab_env(), "MLFLOW_TRACKING_URI": url, "HPOLAB_METRICS_FLUSH_S": flush_s}
    run_cli("--store", str(store), "study", "run", FAULT_SPEC, f"name={name}", f"n_trials={trials}", f"trainer.max_epochs={epochs}",
            f"log_models={models}", "keep_checkpoints={top_k: 1}", cwd=FAULT_PROJECT, env=env)
    time.sleep(0.5)  # the access log line of the last request
    made = requests_in(log, start)  # the study's own (the checks below read too)
    client = MlflowClient(url)
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id], "tags.`hpolab.role` = 'trial'")
    assert len(runs) == trials
    for run in runs:
        assert run.data.tags["hpolab.state"] == "COMPLETE" and run.info.status == "FINISHED" and run.info.end_time
        for key in ("val_acc", "train_loss", "epoch_seconds"):  # every epoch's metrics arrived
            assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == list(range(1, epochs + 1))
        assert {"config.yaml", "code"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    return made


@pytest.mark.slow
def test_requests_per_trial_do_not_grow_with_epochs(mlflow_server, tmp_path):
    url, log = mlflow_server
    one = _study(tmp_path / "s1", url, "one-epoch", 1, log, flush_s="600")
    six = _study(tmp_path / "s6", url, "six-epochs", 6, log, flush_s="600")
    assert one, log.read_text()[-2000:]  # the access log is read: requests were counted
    assert six == one, f"6 epochs made {sum(six.values())} requests, 1 epoch {sum(one.values())}: {six - one}"
    # the default interval: at most one metrics write per interval, plus the end's
    start = time.monotonic()
    default = _study(tmp_path / "sd", url, "default-flush", 6, log, flush_s="2")
    bound = 1 + (time.monotonic() - start) / 2.0
    batches = default[("POST", "/api/2.0/mlflow/runs/log-batch")] - one[("POST", "/api/2.0/mlflow/runs/log-batch")]
    assert batches <= bound, (batches, bound)


@pytest.mark.slow
def test_a_trial_run_is_written_not_read_back(mlflow_server, tmp_path):
    """What each further trial adds to a study's requests: its run is created, written and closed, its
    files uploaded and listed once, and retention's deletes (keep_checkpoints top_k 1 pushes one run's
    best.pt out per trial); never a `runs/get` of its own run (the artifact URI comes from runs/create)."""
    url, log = mlflow_server
    one = _study(tmp_path / "s1", url, "one-trial", 1, log, flush_s="600")
    three = _study(tmp_path / "s3", url, "three-trials", 1, log, flush_s="600", trials=3)
    per_trial = {k: (three[k] - one[k]) / 2 for k in three}
    gets = per_trial.get(("GET", "/api/2.0/mlflow/runs/get"), 0)
    assert gets == 0, per_trial
    assert ("POST", "/api/2.0/mlflow/logged-models/search") not in per_trial, per_trial
    # retention's runs and promote runs: one `runs/search` each per pass, not per trial
    assert per_trial.get(("POST", "/api/2.0/mlflow/runs/search"), 0) <= 1, per_trial
    assert sum(per_trial.values()) <= 12, per_trial


def test_retention_hands_out_deletes_at_most_every_interval_and_all_at_the_last_pass(tmp_path, monkeypatch):
    """Each finished trial may make a retention pass; its deletes (and the two reads each batch of them
    costs) go out at most every PURGE_EVERY_S (or PURGE_EVERY_TRIALS trials), the driver's last pass
    takes everything left, and each delete is handed out once."""
    import optuna
    from types import SimpleNamespace

    from hpolab.study.retention import retention as ret

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for v in (0.1, 0.2, 0.3, 0.4):
        study.add_trial(optuna.trial.create_trial(value=v, user_attrs={"mlflow_run_id": f"run{v}"}))
    spec = SimpleNamespace(log_models="none", keep_checkpoints=SimpleNamespace(top_k=1))
    clock = [1000.0]
    monkeypatch.setattr(ret.time, "monotonic", lambda: clock[0])
    r = ret.Retention(spec, study, lambda n: tmp_path / str(n))
    trials = study.get_trials(deepcopy=False)
    # as the tracker does after each finished trial: a pass when trials_due() says one is due
    assert r.trials_due() is None  # an interval from the start...
    clock[0] += ret.PURGE_EVERY_S
    assert r.trials_due() is not None
    first = r.plan(trials[:2])
    assert [(w, n) for w, n, *_ in first] == [("checkpoints", 0)]
    assert r.trials_due() is None  # ...and between two passes
    clock[0] += ret.PURGE_EVERY_S
    assert r.trials_due() is not None
    assert [n for _, n, *_ in r.plan(trials[:3])] == [1]  # ...and then go
    assert r.trials_due() is None
    assert r.trials_due(last=True) is not None
    assert [n for _, n, *_ in r.plan(trials)] == [2]  # the last pass: at once
    assert r.plan(trials) == []  # each once


def test_rank_tags_are_handed_out_at_most_every_interval_and_always_at_the_last_pass(monkeypatch):
    """Writing the trial models' rank tags reads the study's models (a `logged-models/search`): the
    passes between the driver's start and its last hand ranks out at most every PURGE_EVERY_S."""
    import optuna
    from types import SimpleNamespace

    from hpolab.study.retention import retention as ret

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for v in (0.1, 0.3, 0.2):
        study.add_trial(optuna.trial.create_trial(value=v))
    clock = [1000.0]
    monkeypatch.setattr(ret.time, "monotonic", lambda: clock[0])
    r = ret.Retention(SimpleNamespace(log_models="all", keep_checkpoints="all"), study, lambda n: None)
    trials = study.get_trials(deepcopy=False)
    assert r.rank_tags(trials[:2]) is None  # within the interval
    clock[0] += ret.PURGE_EVERY_S
    assert r.rank_tags(trials[:2])[1]["hpolab.rank"] == "1"
    assert r.rank_tags(trials) is None  # trial 2 changed the ranks: written a pass later...
    clock[0] += ret.PURGE_EVERY_S
    assert r.rank_tags(trials)[2]["hpolab.rank"] == "2"
    assert r.rank_tags(trials) is None  # ...and not again while they stay
    assert r.rank_tags(trials, force=True)[2]["hpolab.rank"] == "2"  # the last pass writes them all


@pytest.mark.slow
def test_a_logged_model_reads_no_metric_history(mlflow_server, tmp_path):
    """MLflow's log_model(run_id=...) links the run's metrics of step 0 to the model by reading the run
    and each metric's history (~11 requests a model); a trial has no step 0 (model_links.py links the
    model's epoch). The model still names its run: as the run's output, its record and its MLmodel."""
    import mlflow

    url, log = mlflow_server
    made = _study(tmp_path / "m", url, "with-model", 2, log, flush_s="600", models="all")
    assert ("GET", "/api/2.0/mlflow/metrics/get-history") not in made, made
    client = MlflowClient(url)
    run = client.search_runs([client.get_experiment_by_name("with-model").experiment_id], "tags.`hpolab.role` = 'trial'")[0]
    model_id = run.data.tags["hpolab.model_id"]
    assert [o.model_id for o in client.get_run(run.info.run_id).outputs.model_outputs] == [model_id]
    assert client.get_logged_model(model_id).source_run_id == run.info.run_id
    mlflow.set_tracking_uri(url)
    try:
        assert mlflow.models.get_model_info(f"models:/{model_id}").run_id == run.info.run_id
    finally:
        mlflow.set_tracking_uri(None)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
