"""Two workers on a team's stores: one-epoch trials per second, and MLflow server requests per trial.

    PYTHONPATH=platform .venv/bin/python bench/team_workers.py [--trials 150] [--workers 2] [--root TREE]

PostgreSQL (Optuna) + `mlflow server` with a PostgreSQL backend and served artifacts, started natively on
loopback (bench/team_stores.py, as bench/scale.py --stores team runs them), fresh for each run. The
workers are `hpolab worker` processes (parallel 1 each) on one study of one-epoch digits trials
(`log_models: none`, random sampler, no pruning). Reported: trials/s over the whole study (first trial
start -> last trial complete, from Optuna), over the first and the last 100 trials (or a third of
them), the server's requests per trial from its access log, and the CPU seconds its processes used
while the workers ran (start-up not counted).

--root runs another checkout's hpolab (e.g. an older commit unpacked with `git archive`), so a
before/after pair runs on the same machine at about the same load.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from team_stores import team_stores  # noqa: E402

REQUEST = re.compile(r'"(GET|POST|PUT|PATCH|DELETE) (/[^ ?"]*)')


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min, {os.cpu_count()} cores)"


def rates(storage: str, window: int) -> dict:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = [t for t in optuna.load_study(study_name="team", storage=storage).get_trials(deepcopy=False)
              if t.datetime_complete is not None]
    trials.sort(key=lambda t: t.datetime_complete)
    done = [t.datetime_complete.timestamp() for t in trials]
    start = min(t.datetime_start.timestamp() for t in trials)

    def rate(ts: list[float], since: float) -> float:
        return len(ts) / (ts[-1] - since)

    blocks = [rate(done[i:i + window], done[i - 1] if i else start) for i in range(0, len(done) - window + 1, window)]
    return {"finished": len(trials), "states": dict(collections.Counter(t.state.name for t in trials)),
            f"per_{window}": blocks,
            "trials_per_s": rate(done, start), f"first_{window}": rate(done[:window], start),
            f"last_{window}": rate(done[-window:], done[-window - 1])}


def requests(log: Path, start: int) -> collections.Counter:
    out = collections.Counter()
    for method, path in REQUEST.findall(log.read_text()[start:]):
        path = re.sub(r"/[0-9a-f]{32}(?=/|$)", "/<id>", path)
        path = re.sub(r"(/mlflow-artifacts/artifacts/).*", r"\1...", path)
        out[f"{method} {path}"] += 1
    return out


def _tree_cpu(matches, reaped: bool = False) -> float:
    """CPU seconds (user + system) of the processes `matches(process)` picks and their children so far;
    `reaped`: also what the picked processes' reaped children used (a postmaster's ended backends)."""
    import psutil

    total = 0.0
    for p in psutil.process_iter(["cmdline", "name"]):
        if not matches(p):
            continue
        for q in [p, *p.children(recursive=True)]:
            try:
                t = q.cpu_times()
                total += t.user + t.system + (t.children_user + t.children_system if reaped and q is p else 0.0)
            except psutil.NoSuchProcess:
                pass
    return total


def server_cpu(url: str) -> float:
    """CPU seconds the `mlflow server` at `url` and its worker processes have used so far."""
    port = url.rsplit(":", 1)[1]
    return _tree_cpu(lambda p: {"mlflow", "server", port} <= set(p.info["cmdline"] or []))


def postgres_cpu(storage: str) -> float:
    """CPU seconds the PostgreSQL cluster behind `storage` has used so far: its postmaster with the
    backends it has reaped, and the backends still running."""
    port = storage.rsplit(":", 1)[1].split("/")[0]
    return _tree_cpu(lambda p: p.info["name"] == "postgres" and f"-p {port}" in " ".join(p.info["cmdline"] or []), reaped=True)


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores, everything but idle and iowait)."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def pin_to(i: int):
    """A preexec_fn binding the child to one CPU of this process's, the i-th (mod their number)."""
    cpus = sorted(os.sched_getaffinity(0))
    return lambda: os.sched_setaffinity(0, {cpus[i % len(cpus)]})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=150)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--root", type=Path, default=HERE.parent, help="the checkout whose hpolab runs (default: this one)")
    ap.add_argument("--pin", action="store_true",
                    help="bind worker i to CPU i (mod the CPUs), as Slurm's --cpu-bind or a container's cpuset would")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = args.root.resolve()
    env = {**os.environ, "PYTHONPATH": str(root / "platform"), "PYTHONUNBUFFERED": "1"}
    for k in ("OPTUNA_STORAGE", "MLFLOW_TRACKING_URI", "HPOLAB_STORE"):
        env.pop(k, None)
    folder = Path(tempfile.mkdtemp(prefix="hpolab-team-workers-"))
    exe = str(Path(sys.executable).with_name("hpolab"))
    spec = ["studies/digits_cnn.yaml", "name=team", f"n_trials={args.trials}", "parallel=1", "trainer.max_epochs=1",
            "log_models=none", "sampler={type: random}", "pruner={type: none}", "trainer.early_stopping_patience=null"]
    print(f"{root}: {args.workers} workers, {args.trials} one-epoch trials; {load()}", flush=True)
    with team_stores(folder, env) as (storage, url):
        log = folder / "mlflow-server.log"
        mark = len(log.read_text())
        cpu0, pg0, busy0 = server_cpu(url), postgres_cpu(storage), machine_busy()
        wenv = {**env, "OPTUNA_STORAGE": storage, "MLFLOW_TRACKING_URI": url}
        t0 = time.perf_counter()
        procs = [subprocess.Popen([exe, "--store", str(folder / f"w{i}"), "worker", *spec], cwd=root, env=wenv,
                                  stdout=(folder / f"w{i}.log").open("w"), stderr=subprocess.STDOUT,
                                  preexec_fn=pin_to(i) if args.pin else None) for i in range(args.workers)]
        codes = [p.wait() for p in procs]
        wall = time.perf_counter() - t0
        time.sleep(1.0)  # the last access log lines
        cpu = server_cpu(url) - cpu0
        pg, busy = postgres_cpu(storage) - pg0, machine_busy() - busy0
        if any(codes):
            sys.exit(f"team_workers: worker exit codes {codes}; see {folder}")
        out = {"root": str(root), "workers": args.workers, "trials": args.trials, "wall": wall,
               **rates(storage, min(100, args.trials // 3))}
        counted = requests(log, mark)
        out["requests_per_trial"] = sum(counted.values()) / out["finished"]
        out["by_endpoint_per_trial"] = {k: v / out["finished"] for k, v in counted.most_common()}
        out["server_cpu_s"], out["server_cpu_s_per_trial"] = cpu, cpu / out["finished"]
        # where the machine's CPU went, per finished trial: the MLflow server, PostgreSQL, and the machine
        # as a whole; the rest is the workers with their trial processes (and anything else running here:
        # run it on a quiet machine). (The trials' own CPU cannot be read from here: the forkserver that
        # reaps them is not waited for by its worker.)
        n = out["finished"]
        out["cpu_s_per_trial"] = {"mlflow_server": cpu / n, "postgres": pg / n, "machine": busy / n,
                                  "rest: workers and trials": (busy - cpu - pg) / n}
    out["load_end"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
