"""What an ASHA promotion costs a trial: the time between its rung epoch and its next epoch.

    PYTHONPATH=platform .venv/bin/python bench/promotion_gap.py [--seeds 0] [--compare-root DIR] [--json FILE]

Runs bench/multifidelity.py's ASHA arm (36 configurations, rungs 1, 3, 9, 27, `budget.epochs` 324) at
`parallel: 1` through the real CLI, in a fresh store per run, and reads the study metric's MLflow
timestamps (the driver's, as each epoch's message came in). Per promotion that happened at once it
gives the gap from the rung's epoch to the next epoch:

- in process: the trial was promoted as it reached its rung and went on in its process (the line
  `trial N promoted at rung k (epoch e): goes on in its process`);
- paused, resumed at once: it paused, and the driver's next start resumed it (its `paused` line is
  followed by its own `resumed after epoch e` line): the pause, the claim and a new process.

Promotions that waited in the paused state for other trials are left out (their gap is mostly the
wait). The median gap between any two epochs in a row (the first 12 trials) is given beside them. With
--compare-root DIR each seed runs with DIR's hpolab ("before") and then this checkout's ("after").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from multifidelity import SPEC, STUDY, arm_overrides  # noqa: E402


def promotions(lines: list[str]) -> dict[str, list[tuple[int, int]]]:
    """(trial, rung epoch) of each promotion made at once, by kind, from a `study run`'s lines."""
    out: dict[str, list[tuple[int, int]]] = {"in process": [], "paused, resumed at once": []}
    for i, line in enumerate(lines):
        m = re.search(r"trial (\d+) promoted at rung \d+ \(epoch (\d+)\): goes on in its process", line)
        if m:
            out["in process"].append((int(m[1]), int(m[2])))
        m = re.search(r"trial (\d+) paused at rung \d+ \(epoch (\d+)\)", line)
        if m and i + 1 < len(lines) and re.search(rf"trial {m[1]} resumed after epoch {m[2]}\b", lines[i + 1]):
            out["paused, resumed at once"].append((int(m[1]), int(m[2])))
    return out


def run(root: Path, seed: int) -> dict:
    store = Path(tempfile.mkdtemp()) / "store"
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "OPTUNA_STORAGE", "HPOLAB_STORE")}
    env["PYTHONPATH"] = str(root / "platform")
    overrides = [o for o in arm_overrides("asha", 12) if not o.startswith("parallel")] + ["parallel=1", f"seed={seed}"]
    cmd = [str(Path(sys.executable).with_name("hpolab")), "--store", str(store), "study", "run", SPEC, *overrides]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        sys.exit(f"promotion_gap: the study failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    import optuna
    from mlflow import MlflowClient

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    trials = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{store / 'optuna.db'}").trials
    stamps = {t.number: {m.step: m.timestamp / 1000 for m in client.get_metric_history(t.user_attrs["mlflow_run_id"], "val_acc")}
              for t in trials}
    elapsed = re.search(r"elapsed ([\d.]+) s", proc.stdout)
    result = {"seed": seed, "study_s": float(elapsed[1]) if elapsed else None}
    for kind, made in promotions(proc.stdout.splitlines()).items():
        gaps = [stamps[n][e + 1] - stamps[n][e] for n, e in made if e + 1 in stamps[n]]
        result[kind] = {"n": len(gaps), "median_ms": round(statistics.median(gaps) * 1000) if gaps else None}
    row = [stamps[n][e + 1] - stamps[n][e] for n in range(min(12, len(trials))) for e in stamps[n] if e + 1 in stamps[n]]
    result["any_epoch_median_ms"] = round(statistics.median(row) * 1000)
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--compare-root", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    codes = [("before", args.compare_root.resolve()), ("after", ROOT)] if args.compare_root else [("this", ROOT)]
    rows = []
    for seed in args.seeds:
        for code, root in codes:
            r = {"code": code, **run(root, seed)}
            rows.append(r)
            kinds = "; ".join(f"{k}: {r[k]['n']} promotions, median {r[k]['median_ms']} ms"
                              for k in ("in process", "paused, resumed at once") if r[k]["n"])
            print(f"seed {seed} {code}: {kinds}; any two epochs in a row: {r['any_epoch_median_ms']} ms; the study {r['study_s']} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
