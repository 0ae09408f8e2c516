"""Pruning in a study of several objectives: what it saves, and what it costs the front.

    PYTHONPATH=platform .venv/bin/python bench/pareto.py [--trials 16] [--epochs 8] [--parallel 2] [--rounds 1] [--json FILE]

The shipped studies/digits_pareto.yaml (val_acc vs latency_ms, params constraint, NSGA-II) is run
twice through the real CLI with the same budget and seed, side by side in one invocation: once with
its median pruner on val_acc (pruned through the companion study), once with `pruner: none`. Printed:
epochs trained (sum of each trial's hpolab.epochs_run), wall seconds, trials pruned, the feasible
front's size, and its hypervolume -- both fronts against ONE reference point (each objective's worst
value over both runs' feasible complete trials, pushed 10% out), so the two numbers compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
NAME = "digits-pareto"


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "OPTUNA_STORAGE", "HPOLAB_STORE")}
    return {**clean, "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def run_study(store: Path, args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hpolab.cli", "--store", str(store), "study", "run", "studies/digits_pareto.yaml", *args],
                   cwd=ROOT, env=env(), check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def summarise(store: Path) -> dict:
    import optuna
    from mlflow import MlflowClient

    from hpolab.study.objectives import ranking

    study = optuna.load_study(study_name=NAME, storage=f"sqlite:///{store / 'optuna.db'}")
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    trials = study.get_trials()
    epochs = sum(int(client.get_run(t.user_attrs["mlflow_run_id"]).data.tags.get("hpolab.epochs_run", 0))
                 for t in trials if t.user_attrs.get("mlflow_run_id"))
    directions = ranking.directions_of(study)
    return {"study": study, "trials": trials, "directions": directions, "epochs": epochs,
            "pruned": sum(t.state.name == "PRUNED" for t in trials), "front": ranking.front(trials, directions)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="pairs run in turn, order swapped each round; figures summed")
    ap.add_argument("--json")
    a = ap.parse_args()
    from hpolab.study.objectives import ranking

    common = [f"n_trials={a.trials}", f"trainer.max_epochs={a.epochs}", f"parallel={a.parallel}"]
    pairs = (("median pruner on val_acc", []), ("no pruning", ["pruner={type: none}"]))
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hpolab-pareto-") as tmp:
        for i in range(a.rounds):  # each round: both runs, the order swapped (the first run pays cold caches)
            done = {}
            for label, extra in (pairs if i % 2 == 0 else pairs[::-1]):
                store = Path(tmp) / f"{label.split()[0]}-{i}"
                wall = run_study(store, common + extra + [f"seed={i}"])
                done[label] = {**summarise(store), "wall": wall}
            rounds.append(done)
        rows = {label: {"trials": [t for r in rounds for t in r[label]["trials"]],
                        "epochs": sum(r[label]["epochs"] for r in rounds), "wall": sum(r[label]["wall"] for r in rounds),
                        "pruned": sum(r[label]["pruned"] for r in rounds), "fronts": [r[label]["front"] for r in rounds],
                        "directions": rounds[0][label]["directions"]} for label, _ in pairs}
        everyone = [t for r in rows.values() for t in r["trials"] if t.state.name == "COMPLETE" and ranking.feasible(t)]
        directions = next(iter(rows.values()))["directions"]
        loss = ranking.losses(everyone, directions)
        worst, span = loss.max(0), np.ptp(loss, 0)
        reference = worst + 0.1 * np.where(span > 0, span, np.abs(worst) + 1.0)
        out = {}
        print(f"{a.trials} trials x up to {a.epochs} epochs, parallel={a.parallel}, {a.rounds} round(s) (seed = round); "
              f"one reference point {reference.round(4).tolist()} (losses); sums over rounds, hypervolume the mean")
        print(f"{'run':<28}{'epochs':>8}{'wall s':>9}{'pruned':>8}{'front':>7}{'hypervolume':>13}")
        for label, r in rows.items():
            hv = float(np.mean([ranking.hypervolume(f, directions, reference) for f in r["fronts"]]))
            size = sum(len(f) for f in r["fronts"])
            out[label] = {"epochs": r["epochs"], "wall_s": round(r["wall"], 1), "pruned": r["pruned"], "front": size,
                          "hypervolume": hv}
            print(f"{label:<28}{r['epochs']:>8}{r['wall']:>9.1f}{r['pruned']:>8}{size:>7}{hv:>13.4f}")
        p, n = out["median pruner on val_acc"], out["no pruning"]
        print(f"pruning: {1 - p['epochs'] / n['epochs']:.0%} fewer epochs, {p['wall_s'] / n['wall_s']:.2f}x the wall time, "
              f"hypervolume {p['hypervolume'] / n['hypervolume']:.2f}x the unpruned run's")
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
