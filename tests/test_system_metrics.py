"""Each trial's system metrics in MLflow's format (system/...), for its own processes.

First the probe on real processes started here (a parent holding memory and threads, and a child
of its own: both counted, the host's other processes not); then real studies through the CLI: the
metrics on every trial run (and none with `system_metrics: false`), compare's and the report's
peak memory and throughput columns. The System metrics tab in a real browser: test_ui_browser.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest
import torch
from mlflow import MlflowClient

from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, open_study, run_cli
from hpolab.study.trials.system_metrics import Probe

# a parent holding 60 MB and 3 extra threads, with a child holding 40 MB (b"x" * n writes every page)
TREE = ("import subprocess, sys, threading, time\n"
        "held = b'x' * 60_000_000\n"
        "for _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "child = subprocess.Popen([sys.executable, '-c', \"import time; held = b'y' * 40_000_000; print('child', flush=True); time.sleep(60)\"],"
        " stdout=subprocess.PIPE, text=True)\n"
        "child.stdout.readline(); print('ready', flush=True); time.sleep(60)\n")
KEYS = ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes", "system/system_memory_usage_percentage",
        "system/thread_count", "system/peak_memory_megabytes", "system/samples_per_second", "system/data_wait_percentage")


def test_the_probe_counts_a_trials_processes_and_its_children_only():
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        probe = Probe(proc.pid, run_start=time.time() - 3, interval=1.0)
        time.sleep(0.5)
        values = probe.read()
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        assert len(tree) == 2 and set(probe.procs) == {p.pid for p in tree}
        rss = sum(p.memory_info().rss for p in tree) / 1e6
        assert 100 < values["system_memory_usage_megabytes"] == pytest.approx(rss, rel=0.05)  # 60 + 40 MB and two interpreters
        assert values["system_memory_usage_megabytes"] < psutil.virtual_memory().used / 1e6  # not the host's
        assert values["thread_count"] == sum(p.num_threads() for p in tree) >= 5  # 1 + 3 in the parent, 1 in the child
        assert values["peak_memory_megabytes"] == values["system_memory_usage_megabytes"]
        assert 0 <= values["cpu_utilization_percentage"] < 50  # both asleep
        assert values["system_memory_usage_percentage"] == pytest.approx(rss * 1e6 / psutil.virtual_memory().total * 100, rel=0.05)
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait()
    with pytest.raises(psutil.NoSuchProcess):
        probe.read()  # (the driver then drops the trial's probe: its last sample was its last)


def test_a_trial_that_reports_before_the_first_sample_is_due_is_sampled_then(tmp_path):
    """A trial shorter than the first sample's delay still gets its system metrics: the driver samples
    it when its first report waits in the pipe (the process is alive then; after it ends there is
    nothing left to read)."""
    import multiprocessing as mp
    from types import SimpleNamespace

    from hpolab.study.trials.metric_batches import MetricBatches
    from hpolab.study.trials.system_metrics import SystemMetrics

    parent, child = mp.Pipe()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tracker = SimpleNamespace(metrics=MetricBatches(flush_s=1e9), resumed_runs=set(), flush_metrics=lambda run_id: None)
        sampler = SystemMetrics(True, tracker, interval=600)
        r = SimpleNamespace(run_id="r1", process=proc, conn=parent, trial_dir=str(tmp_path), metric_points=[])
        sampler.sample([r])  # started: nothing to say yet, the first sample is not due
        assert tracker.metrics.take("r1") == []
        child.send(("epoch", 0, {"val_acc": 0.5}))  # its first report, long before the first sample is due
        sampler.sample([r])
        points = {m.key: m.value for m in tracker.metrics.take("r1")}
        assert points["system/thread_count"] >= 1 and points["system/system_memory_usage_megabytes"] > 1, points
        assert parent.recv() == ("epoch", 0, {"val_acc": 0.5})  # (left for the driver to read)
        sampler.sample([r])  # sampled once: the next one comes after the interval
        assert tracker.metrics.take("r1") == []
    finally:
        proc.kill()
        proc.wait()


ARGS = [FAULT_SPEC, "n_trials=2", "trainer.max_epochs=4", "model.sleep=0.03", "log_models=none", "pruner={type: none}"]


def _env() -> dict:
    return {**hpolab_env(), "HPOLAB_SYSTEM_METRICS_INTERVAL": "0.2"}


@pytest.mark.slow
def test_every_trial_run_gets_its_system_metrics_and_compare_and_the_report_show_them(store, tmp_path):
    run_cli("--store", str(store), "study", "run", *ARGS, "name=sysm", cwd=FAULT_PROJECT, env=_env())
    client, study = open_study(store, "sysm")
    for t in study.trials:
        run_id = t.user_attrs["mlflow_run_id"]
        metrics = client.get_run(run_id).data.metrics
        assert set(KEYS) <= set(metrics), sorted(metrics)
        cpu = client.get_metric_history(run_id, "system/cpu_utilization_percentage")
        steps = [m.step for m in cpu]
        assert len(cpu) >= 2 and steps == sorted(steps) and steps[-1] <= 60  # seconds since the run started
        assert any(m.value > 0 for m in cpu)  # it trained (sleeping a little in each forward)
        peak = [m.value for m in client.get_metric_history(run_id, "system/peak_memory_megabytes")]
        assert peak == sorted(peak) and metrics["system/peak_memory_megabytes"] == max(
            m.value for m in client.get_metric_history(run_id, "system/system_memory_usage_megabytes"))
        assert 20 < metrics["system/peak_memory_megabytes"] < psutil.virtual_memory().total / 1e6
        epochs = {round(m.value, 2) for m in client.get_metric_history(run_id, "samples_per_second")}
        mirrored = {m.value for m in client.get_metric_history(run_id, "system/samples_per_second")}
        assert mirrored <= epochs  # an epoch's throughput, as the routine measured it
    shown = run_cli("--store", str(store), "compare", "sysm", cwd=tmp_path, env={**hpolab_env(), "COLUMNS": "250"}).stdout
    assert "peak" in shown and "MB" in shown and "samples/s" in shown  # (a header may wrap)
    rows = json.loads(run_cli("--store", str(store), "compare", "sysm", "--format", "json", cwd=tmp_path).stdout)
    assert all(r["metrics.system/peak_memory_megabytes"] > 20 and r["metrics.samples_per_second"] > 0 for r in rows)
    report = tmp_path / "r.html"
    run_cli("--store", str(store), "report", "sysm", "--out", str(report), cwd=tmp_path)
    html = report.read_text()
    assert "<th>peak MB</th>" in html and "<th>samples/s</th>" in html, html[:2000]


@pytest.mark.slow
def test_system_metrics_false_logs_none(store):
    run_cli("--store", str(store), "study", "run", *ARGS, "name=nosys", "n_trials=1", "system_metrics=false", cwd=FAULT_PROJECT, env=_env())
    client, study = open_study(store, "nosys")
    metrics = client.get_run(study.trials[0].user_attrs["mlflow_run_id"]).data.metrics
    assert "val_acc" in metrics and not [k for k in metrics if k.startswith("system/")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_trial_logs_its_gpu_memory(store):
    run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", "name=gpu", "n_trials=1", "trainer.max_epochs=3",
            "trainer.device=cuda", env=_env())
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    _, study = open_study(store, "gpu")
    metrics = client.get_run(study.trials[0].user_attrs["mlflow_run_id"]).data.metrics
    assert metrics["system/peak_gpu_0_memory_megabytes"] > 0 and "system/gpu_0_memory_usage_megabytes" in metrics
