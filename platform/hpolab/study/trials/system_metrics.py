"""Each trial's own system metrics, in MLflow's format: the run page's System metrics tab shows them.

MLflow's monitor (mlflow.system_metrics) samples the whole host; a study runs several trials on a
host, so each trial's run gets the figures of *its* processes (the trial process and its children:
DataLoader workers, the ranks of a trial on several devices), under the keys MLflow's monitor uses:

    system/cpu_utilization_percentage     CPU time of its processes, % of the CPUs the trial may use
                                           (its affinity set): 100 = all of them busy
    system/system_memory_usage_megabytes   resident memory (RSS) of its processes, MB (10^6 bytes)
    system/system_memory_usage_percentage  that RSS as a share of the host's memory
    system/gpu_0_memory_usage_megabytes    on CUDA: the memory its tensors hold (torch.cuda.memory_allocated,
    system/gpu_0_memory_usage_percentage     written by the trial process: gpu_memory.py), and its share
    system/gpu_0_utilization_percentage    on CUDA with NVML (nvidia-ml-py installed): its GPU's utilisation

and, with no MLflow counterpart, under the same prefix so that the tab shows them beside those:

    system/thread_count                    threads of its processes
    system/samples_per_second              the last epoch's training throughput (the routine's metric)
    system/data_wait_percentage            the last epoch's share of training time spent waiting for data
    system/peak_memory_megabytes           the highest RSS sampled so far (its last value: the trial's peak)
    system/peak_gpu_0_memory_megabytes     torch.cuda.max_memory_allocated (its last value: the peak)

The step of a point is the seconds since the trial's run started (so a paused trial's later segment
goes on from there); the first sample is taken FIRST_S after the trial starts (or when it first reports,
if that is sooner), then every INTERVAL_S (HPOLAB_SYSTEM_METRICS_INTERVAL). Sampling runs on the driver's loop, reading /proc for the trial's
processes (no thread in the trial, nothing it waits for); the points join the run's batched epoch
metrics (metric_batches.py). bench/system_metrics.py measures its cost (docs/benchmarks.md).
`system_metrics: false` in the spec turns it off.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterable

import psutil

INTERVAL_S = float(os.environ.get("HPOLAB_SYSTEM_METRICS_INTERVAL", "2"))
FIRST_S = 0.5  # the first sample, after the trial process has started (a fork's first RSS is its parent's)
CHILDREN_EVERY = 5  # samples between two listings of the trial's child processes (a scan of every process)
GPU_FILE = ".gpu_memory.json"  # in the trial's folder, written by the trial process (gpu_memory.py)
PREFIX = "system/"


class Probe:
    """The processes of one trial: its psutil.Process objects (cpu_percent measures since the last call)."""

    def __init__(self, pid: int, run_start: float, interval: float):
        self.root = psutil.Process(pid)
        self.run_start = run_start  # time.time() of the run's start: steps are seconds since then
        self.interval = interval
        self.next = time.monotonic() + min(FIRST_S, interval)
        self.samples = 0
        self.procs: dict[int, psutil.Process] = {}
        self._primed: set[int] = set()
        self.peak_rss = 0.0
        self.total_memory = psutil.virtual_memory().total
        self._list()

    def _list(self) -> None:
        found = [self.root] + self.root.children(recursive=True)
        self.procs = {p.pid: self.procs.get(p.pid, p) for p in found}
        for p in found:
            if p.pid not in self._primed:
                p.cpu_percent(None)  # the first call only starts the measurement
                self._primed.add(p.pid)

    def read(self) -> dict[str, float]:
        """The trial's processes now (psutil.NoSuchProcess: the trial process is gone)."""
        self.samples += 1
        if self.samples % CHILDREN_EVERY == 0:
            self._list()
        cpu = rss = threads = 0.0
        for pid, p in list(self.procs.items()):
            try:
                with p.oneshot():
                    cpu += p.cpu_percent(None)
                    rss += p.memory_info().rss
                    threads += p.num_threads()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                if p is self.root:
                    raise
                del self.procs[pid]  # a DataLoader worker that ended
        try:
            n_cpus = len(self.root.cpu_affinity()) or 1
        except (psutil.Error, AttributeError):
            n_cpus = psutil.cpu_count() or 1
        self.peak_rss = max(self.peak_rss, rss)
        return {"cpu_utilization_percentage": round(cpu / n_cpus, 1), "system_memory_usage_megabytes": round(rss / 1e6, 1),
                "system_memory_usage_percentage": round(rss / self.total_memory * 100, 2), "thread_count": threads,
                "peak_memory_megabytes": round(self.peak_rss / 1e6, 1)}


class SystemMetrics:
    """Samples the running trials when due; the points go to each run's metric batch."""

    def __init__(self, enabled: bool, tracker, interval: float | None = None):
        self.enabled = enabled
        self.tracker = tracker  # its MetricBatches take the points (written with the epochs' metrics)
        self.interval = INTERVAL_S if interval is None else interval
        self.probes: dict[str, Probe] = {}  # run id -> the probe of its current process
        self.cost_s = 0.0  # CPU seconds spent sampling (the bench reads it)

    def sample(self, running: Iterable) -> None:
        if not self.enabled:
            return
        t0 = time.thread_time()
        now = time.monotonic()
        live = set()
        for r in running:
            if r.process is None or r.process.pid is None:
                continue
            live.add(r.run_id)
            probe = self.probes.get(r.run_id)
            try:
                if probe is None or probe.root.pid != r.process.pid:
                    probe = self.probes[r.run_id] = Probe(r.process.pid, self._run_start(r), self.interval)
                if now >= probe.next or (probe.samples == 0 and _has_news(r)):
                    probe.next = now + self.interval
                    self._record(r, probe)
            except psutil.Error:  # it ended between the check and the read: its last sample was the last
                self.probes.pop(r.run_id, None)
        for gone in set(self.probes) - live:
            del self.probes[gone]
        self.cost_s += time.thread_time() - t0

    def _run_start(self, r) -> float:
        """time.time() of the run's start: now for a new run; a resumed run's (a paused trial's later
        segment, maybe on another worker) from MLflow, so its steps go on."""
        t = self.tracker
        if r.run_id not in t.resumed_runs:
            return time.time()
        return t.mlflow_guard(t.client.get_run, r.run_id).info.start_time / 1000

    def _record(self, r, probe: Probe) -> None:
        values = probe.read()
        values.update(gpu_values(Path(r.trial_dir) / GPU_FILE))
        values.update(_throughput(r.metric_points))
        step = max(0, int(time.time() - probe.run_start))
        self.tracker.metrics.add(r.run_id, step, {PREFIX + k: v for k, v in values.items()})
        if self.tracker.metrics.due(r.run_id):
            self.tracker.flush_metrics(r.run_id)


def _has_news(r) -> bool:
    """The trial has sent something (an epoch's metrics, its result) that the driver has not read yet: a
    trial shorter than the first sample's delay is sampled then, while it is still alive, so every
    trial's run has its system metrics."""
    try:
        return r.conn is not None and r.conn.poll()
    except (OSError, EOFError):
        return False


def gpu_values(path: Path) -> dict[str, float]:
    """What the trial process last wrote of its GPU memory ({} on a CPU, or before it used CUDA)."""
    try:
        return {k: float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _throughput(points: list) -> dict[str, float]:
    """The last epoch's samples_per_second and data_wait_fraction (as a percentage) the run was given."""
    out: dict[str, float] = {}
    for m in reversed(points[-64:]):  # (the last epochs' points: a run logs a dozen metrics per epoch)
        if m.key == "samples_per_second" and "samples_per_second" not in out:
            out["samples_per_second"] = round(m.value, 2)
        elif m.key == "data_wait_fraction" and "data_wait_percentage" not in out:
            out["data_wait_percentage"] = round(m.value * 100, 2)
        if len(out) == 2:
            break
    return out
