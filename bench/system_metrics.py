"""What sampling each trial's system metrics costs (study/trials/system_metrics.py), three ways.

    PYTHONPATH=platform .venv/bin/python bench/system_metrics.py [--samples 300] [--pairs 8] [--rounds 2]
        [--trials 3] [--epochs 6] [--json bench/results/system_metrics.json]

1. Per sample: the driver's Probe and the points it adds, on a real process tree like a trial's (a
   process training a small torch model in a loop, with two child processes), sampled --samples times
   back to back. CPU seconds per sample (this thread's, time.thread_time) against the sampling interval:
   the share of one CPU the sampling takes.
2. Its effect on a trial, side by side: a process doing a fixed amount of training work (a torch model,
   one thread) times itself, while this process samples it as the driver would: not at all, every
   INTERVAL_S (the default), and 20 times as often (to make the effect measurable); --pairs rounds, the
   order rotated each round, medians of the work's wall time and their ratios to "off".
3. A real study, side by side: the digits study with `system_metrics: true` and `false`, --rounds rounds
   in alternating order, each in a fresh store: the command's wall time and the trials' training time
   (the sum of their epoch_seconds, read back from MLflow). On a shared machine its ratios are noise
   beyond a few percent; 1 and 2 are the stable figures.
The machine load (os.getloadavg) is printed before each measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))

TRIAL_LIKE = ("import subprocess, sys, torch\n"
              "kids = [subprocess.Popen([sys.executable, '-c', 'import time; b = bytearray(20_000_000); time.sleep(600)']) for _ in range(2)]\n"
              "torch.set_num_threads(1); m = torch.nn.Linear(256, 256); x = torch.randn(64, 256)\n"
              "print('ready', flush=True)\n"
              "while True: m(x).sum().backward()\n")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min, {os.cpu_count()} cores)"


def per_sample(samples: int) -> dict:
    """CPU seconds of one sample (the probe's reads and the points added to the run's batch)."""
    import psutil

    from hpolab.study.trials.metric_batches import MetricBatches
    from hpolab.study.trials.system_metrics import INTERVAL_S, PREFIX, Probe

    proc = subprocess.Popen([sys.executable, "-c", TRIAL_LIKE], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        time.sleep(1.0)
        probe, batches = Probe(proc.pid, time.time(), INTERVAL_S), MetricBatches(flush_s=3600)
        batches.start("run")
        t0 = time.thread_time()
        for _ in range(samples):
            values = probe.read()
            batches.add("run", 0, {PREFIX + k: v for k, v in values.items()})
        cpu = (time.thread_time() - t0) / samples
        processes = len(probe.procs)
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait()
    return {"cpu_s_per_sample": cpu, "processes": processes, "interval_s": INTERVAL_S, "share_of_one_cpu": cpu / INTERVAL_S}


WORK = ("import sys, time, torch\n"
        "torch.set_num_threads(1); torch.manual_seed(0); m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.01); x = torch.randn(128, 256); y = torch.randint(0, 10, (128,))\n"
        "print('ready', flush=True); sys.stdin.readline(); t0 = time.perf_counter()\n"
        "for _ in range(int(sys.argv[1])): opt.zero_grad(); torch.nn.functional.cross_entropy(m(x), y).backward(); opt.step()\n"
        "print(time.perf_counter() - t0, flush=True)\n")


def timed_work(steps: int, interval: float | None) -> float:
    """Seconds the work takes while sampled every `interval` s (None: not sampled)."""
    from hpolab.study.trials.metric_batches import MetricBatches
    from hpolab.study.trials.system_metrics import PREFIX, Probe

    proc = subprocess.Popen([sys.executable, "-c", WORK, str(steps)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    probe, batches = Probe(proc.pid, time.time(), interval or 1.0), MetricBatches(flush_s=3600)
    batches.start("run")
    proc.stdin.write("go\n")
    proc.stdin.flush()
    while proc.poll() is None:
        if interval is None:
            time.sleep(0.05)
            continue
        time.sleep(interval)
        try:
            batches.add("run", 0, {PREFIX + k: v for k, v in probe.read().items()})
        except Exception:  # (it ended meanwhile)
            break
    out = float(proc.stdout.readline())
    proc.wait()
    return out


def effect_on_a_trial(pairs: int, steps: int) -> dict:
    from hpolab.study.trials.system_metrics import INTERVAL_S

    modes = {"off": None, f"every {INTERVAL_S:g} s": INTERVAL_S, f"every {INTERVAL_S / 20:g} s": INTERVAL_S / 20}
    times: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(pairs):
        order = list(modes)[i % 3:] + list(modes)[:i % 3]
        print(f"effect round {i + 1}: {load()}", flush=True)
        for mode in order:
            times[mode].append(timed_work(steps, modes[mode]))
    med = {m: statistics.median(v) for m, v in times.items()}
    return {"seconds": times, "medians": med, "ratio_to_off": {m: med[m] / med["off"] for m in modes}}


def one_study(on: bool, trials: int, epochs: int) -> dict:
    """(wall s, the driver's CPU s, sum of the trials' epoch_seconds)."""
    with tempfile.TemporaryDirectory(prefix="hpolab-bench-sysm-") as tmp:
        cmd = [sys.executable, "-m", "hpolab.cli", "--store", tmp, "study", "run", "studies/digits_cnn.yaml", "name=bench",
               f"n_trials={trials}", f"trainer.max_epochs={epochs}", "trainer.early_stopping_patience=null", "parallel=1",
               "pruner={type: none}", "sampler={type: random}", "log_models=none", f"system_metrics={'true' if on else 'false'}"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "platform")}, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            sys.exit(f"system_metrics bench: the study failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow.db")
        runs = client.search_runs([client.get_experiment_by_name("bench").experiment_id], "attributes.run_name LIKE 'trial-%'")
        training = sum(m.value for r in runs for m in client.get_metric_history(r.info.run_id, "epoch_seconds"))
        sampled = sum(1 for r in runs if "system/thread_count" in r.data.metrics)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"wall_s": wall, "driver_cpu_s": cpu, "training_s": training, "runs_with_system_metrics": sampled}


def side_by_side(rounds: int, trials: int, epochs: int) -> dict:
    results: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(rounds):
        for side in (("on", "off") if i % 2 == 0 else ("off", "on")):
            print(f"round {i + 1}, system_metrics {side}: {load()}", flush=True)
            results[side].append(one_study(side == "on", trials, epochs))
            print(f"  {results[side][-1]}", flush=True)
    med = {side: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "driver_cpu_s", "training_s")} for side, rs in results.items()}
    ratios = {k: med["on"][k] / med["off"][k] for k in ("wall_s", "driver_cpu_s", "training_s")}
    return {"rounds": results, "medians": med, "ratio_on_off": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3000, help="training steps of the timed work (about 4 s on one core)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print(f"per sample: {load()}", flush=True)
    sample = per_sample(args.samples)
    print(f"  {sample['cpu_s_per_sample'] * 1e3:.2f} ms CPU per sample of {sample['processes']} processes; every "
          f"{sample['interval_s']:g} s that is {sample['share_of_one_cpu'] * 100:.3f}% of one CPU", flush=True)
    out = {"per_sample": sample}
    if args.pairs:
        out["effect_on_a_trial"] = eff = effect_on_a_trial(args.pairs, args.steps)
        print("work seconds (median): " + ", ".join(f"{m} {v:.3f}" for m, v in eff["medians"].items()))
        print("ratio to off:          " + ", ".join(f"{m} {v:.4f}x" for m, v in eff["ratio_to_off"].items()))
    if args.rounds:
        out["side_by_side"] = sbs = side_by_side(args.rounds, args.trials, args.epochs)
        print("medians: " + json.dumps(sbs["medians"]))
        print("on/off:  " + ", ".join(f"{k} {v:.3f}x" for k, v in sbs["ratio_on_off"].items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
