"""Scale benchmark: a store of N real finished trials, then what reading it back costs.

    PYTHONPATH=platform .venv/bin/python bench/scale.py [--stores embedded|team] [--trials 1000] [--parallel 2]
        [--store DIR] [--reuse] [--json FILE]

1. Make the store: one `hpolab study run` of N one-epoch trials of the digits CNN (random sampler, no
   pruning, the default retention), as a user runs it. While it runs, the driver's open file
   descriptors and resident memory are sampled from /proc every second. `--reuse` skips this step when
   `--store` already holds the study (e.g. to time the commands again after a change).
   `--stores team`: a team's stores instead (PostgreSQL + `mlflow server` on loopback, two `hpolab
   worker`s, more studies beside it, one being written while the commands are timed): bench/scale_team.py.
2. Time each read command as a subprocess, as a user pays it (Python start + imports included):
   `study status`, `study list`, `compare --top 10`, `report` (and its page size), `study check`.
3. Print a table: the figures, the issue's targets, and the driver's trials/s around trial 100 vs the
   last 100 trials (from Optuna's trial start/complete times), fds and memory at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "scale"
SPEC = ["studies/digits_cnn.yaml", f"name={NAME}", "trainer.max_epochs=1", "pruner={type: none}",
        "sampler={type: random}", "trainer.early_stopping_patience=null"]
# (label, CLI args after the global ones, target seconds)
FLOOR = "import optuna, mlflow (floor)"  # what any command pays before it reads anything
COMMANDS = [(FLOOR, [], None), ("study status", ["study", "status", NAME], 1.0), ("study list", ["study", "list"], 1.0),
            ("compare --top 10", ["compare", NAME, "--top", "10"], 2.0),
            ("report", ["report", NAME, "--out", "{store}/reports/scale.html"], 8.0),
            ("study check", ["study", "check", NAME], 5.0)]


def env() -> dict[str, str]:
    # This worktree's hpolab, whatever is installed in the venv.
    return {**os.environ, "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def hpolab(store: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "hpolab.cli", "--store", str(store), *args]


def proc_sample(pid: int) -> tuple[int, float] | None:
    """(open fds, resident MB) of the process `pid` and its threads; None once it is gone."""
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:"))
        return fds, rss / 1024
    except (OSError, StopIteration):
        return None


def make_store(store: Path, trials: int, parallel: int) -> list[tuple[float, int, float]]:
    """Run the study; the driver's (time, fds, RSS MB) every second."""
    store.mkdir(parents=True, exist_ok=True)
    log = store / "bench-run.log"
    cmd = hpolab(store, "study", "run", *SPEC, f"n_trials={trials}", f"parallel={parallel}")
    samples = []
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            s = proc_sample(proc.pid)
            if s is not None:
                samples.append((time.time(), *s))
            time.sleep(1.0)
    if proc.returncode != 0:
        sys.exit(f"scale: the study run failed with exit code {proc.returncode}; see {log}")
    return samples


def driver_rates(store: Path) -> dict:
    """Finished trials per second over a window of 50 around trial 100, and over the last 50."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=NAME, storage=f"sqlite:///{store / 'optuna.db'}")
    ends = sorted(t.datetime_complete.timestamp() for t in study.get_trials(deepcopy=False) if t.datetime_complete)

    def rate(lo: int, hi: int) -> float | None:
        lo, hi = max(lo, 0), min(hi, len(ends) - 1)
        return (hi - lo) / (ends[hi] - ends[lo]) if hi > lo and ends[hi] > ends[lo] else None

    return {"n": len(ends), "at_100": rate(75, 125), "at_end": rate(len(ends) - 51, len(ends) - 1)}


def time_commands(store: Path, extra_env: dict[str, str] | None = None, commands: list = COMMANDS) -> list[dict]:
    rows = []
    for label, args, target in commands:
        args = [a.format(store=store) for a in args]
        t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        cmd = [sys.executable, "-c", "import optuna, mlflow"] if label == FLOOR else hpolab(store, *args)
        out = subprocess.run(cmd, cwd=ROOT, env={**env(), **(extra_env or {})}, capture_output=True, text=True)
        wall, ru = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime  # the command's CPU seconds: what a loaded machine does not inflate
        ok = out.returncode == 0 or (label == "study check" and out.returncode == 1)  # 1: it found problems
        rows.append({"command": label, "seconds": wall, "cpu": cpu, "target": target, "rc": out.returncode,
                     "note": "" if ok else (out.stderr.strip().splitlines() or ["?"])[-1][:80]})
    return rows


def du_mb(path: Path) -> float:
    if not path.exists():
        return 0.0
    seen, total = set(), 0
    for p in ([path] if path.is_file() else path.rglob("*")):
        try:
            st = p.lstat()
        except OSError:
            continue
        if p.is_file() and (st.st_dev, st.st_ino) not in seen:  # hard links counted once, like du
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total / 1e6


def print_table(res: dict) -> None:
    print(f"\nscale benchmark ({res.get('stores', 'embedded')} stores): {res['trials']} trials, parallel={res['parallel']}, "
          f"{os.cpu_count()} cores, load {res['load']}")
    print(f"{'figure':<34} {'measured':>12} {'target':>10}")
    for r in res["commands"]:
        flag = "" if r["target"] is None or r["seconds"] <= r["target"] else "  over"
        target = "" if r["target"] is None else "<= " + format(r["target"], "g")
        print(f"{r['command'] + ' (s)':<34} {r['seconds']:>12.2f} {target:>10}{flag}"
              + (f"  rc={r['rc']} {r['note']}" if r["note"] else ""))
    if "page_mb" not in res:
        return
    print(f"{'report page (MB)':<34} {res['page_mb']:>12.2f} {'<= 10':>10}")
    print(f"{'store (MB)':<34} {res['store_mb']:>12.1f} {'<= 100':>10}  (trials/ {res['trials_mb']:.1f}, artifacts/ {res['artifacts_mb']:.1f}, dbs {res['db_mb']:.1f})")
    d = res["driver"]
    if d.get("at_100") and d.get("at_end"):
        print(f"{'trials/s near trial 100 / at end':<34} {d['at_100']:>5.2f} / {d['at_end']:<5.2f} {'within 10%':>10}"
              f"  ({100 * (d['at_end'] / d['at_100'] - 1):+.0f}%)")
    s = res.get("samples") or []
    if len(s) > 20:
        head, tail = s[len(s) // 10], s[-3]
        print(f"{'driver fds (10% in / end)':<34} {head[1]:>5} / {tail[1]:<5} {'flat':>10}")
        print(f"{'driver RSS MB (10% in / end)':<34} {head[2]:>5.0f} / {tail[2]:<5.0f} {'flat':>10}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", choices=("embedded", "team"), default="embedded",
                    help="team: PostgreSQL + an MLflow server on loopback, 2 workers (bench/scale_team.py)")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--store", type=Path, help="default: a new temporary folder (kept, its path printed)")
    ap.add_argument("--reuse", action="store_true", help="time the commands on --store's study without running it")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--pad-to", type=int, default=0, help="team: grow the study to this many trials with copies of its real ones")
    a = ap.parse_args()
    if a.trials < 1:
        sys.exit("scale: --trials must be >= 1")
    store = (a.store or Path(tempfile.mkdtemp(prefix="hpolab-scale-")) / "store").resolve()
    print(f"store: {store}", flush=True)
    if a.stores == "team":
        from scale_team import run_team

        return run_team(store, a.trials, a.reuse, a.json, a.pad_to)
    samples: list = []
    if not (a.reuse and (store / "optuna.db").exists()):
        t0 = time.perf_counter()
        samples = make_store(store, a.trials, a.parallel)
        print(f"study run: {time.perf_counter() - t0:.0f} s", flush=True)
    one, five, fifteen = os.getloadavg()
    res = {"trials": a.trials, "parallel": a.parallel, "load": f"{one:.2f}/{five:.2f}/{fifteen:.2f}",
           "commands": time_commands(store), "driver": driver_rates(store), "samples": samples}
    page = store / "reports" / "scale.html"
    res["page_mb"] = page.stat().st_size / 1e6 if page.exists() else 0.0
    res.update(store_mb=du_mb(store), trials_mb=du_mb(store / "trials"), artifacts_mb=du_mb(store / "artifacts"),
               db_mb=sum(du_mb(store / n) for n in ("optuna.db", "mlflow.db")))
    print_table(res)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
