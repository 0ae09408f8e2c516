"""MLflow requests per trial are bounded: epochs are batched, not one round trip each.

End to end: a real `mlflow server` on loopback (its access log counts the requests), one study of a
1-epoch trial and one of a 6-epoch trial: with a flush interval longer than the trials, both make
the same number of requests, endpoint by endpoint, and every epoch's metrics still arrive. With the
default interval a run makes at most one metrics write per interval plus one at its end.
The batching itself is tested on its own below.
"""

from __future__ import annotations

import collections
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


def _study(store, url, name: str, epochs: int, log, flush_s: str) -> collections.Counter:
    start = len(log.read_text())
    env = {**hpolab_env(), "MLFLOW_TRACKING_URI": url, "HPOLAB_METRICS_FLUSH_S": flush_s}
    run_cli("--store", str(store), "study", "run", FAULT_SPEC, f"name={name}", "n_trials=1", f"trainer.max_epochs={epochs}",
            "log_models=none", cwd=FAULT_PROJECT, env=env)
    time.sleep(0.5)  # the access log line of the last request
    client = MlflowClient(url)
    exp = client.get_experiment_by_name(name)
    (run,) = client.search_runs([exp.experiment_id], "attributes.run_name = 'trial-0'")
    assert run.data.tags["hpolab.state"] == "COMPLETE"
    for key in ("val_acc", "train_loss", "epoch_seconds"):  # every epoch's metrics arrived
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == list(range(1, epochs + 1))
    assert "config.yaml" in [a.path for a in client.list_artifacts(run.info.run_id)]
    return requests_in(log, start)


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
