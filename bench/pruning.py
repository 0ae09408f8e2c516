"""Pruning benchmark: the same trial budget with a pruner vs without, side by side in one run.

    .venv/bin/python bench/pruning.py [--trials 24] [--pruner hyperband] [--reduction-factor 3] [--seeds 0 1]

Runs the digits study (studies/digits_cnn.yaml) twice per seed through the real CLI, each in a
fresh temporary store, with the same sampler seed: once with `pruner: none`, once with the chosen
pruner. Early stopping is switched off in both so that only the pruner saves epochs. Prints the
machine's load before each study, total epochs trained, wall time and best validation accuracy, and
their ratios. Target:
>= 2.5x fewer epochs for <= 0.5 points lower best accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# {eta}: the reduction factor (--reduction-factor, else the pruner's default here: 4 and 3)
PRUNERS = {
    "hyperband": "{{type: hyperband, kwargs: {{min_resource: 1, max_resource: 12, reduction_factor: {eta}}}}}",
    "successive_halving": "{{type: successive_halving, kwargs: {{min_resource: 1, reduction_factor: {eta}}}}}",
    "median": "{{type: median, kwargs: {{n_startup_trials: 4, n_warmup_steps: 2}}}}",
    "none": "{{type: none}}",
}
DEFAULT_FACTOR = {"hyperband": 3, "successive_halving": 4}


def run_study(pruner: str, seed: int, trials: int, parallel: int, workdir: Path, factor: int | None = None) -> dict:
    """One study through the real CLI in its own store; epochs and best value read back from Optuna."""
    import optuna
    from optuna.trial import TrialState

    store = workdir / f"{pruner}-seed{seed}"
    cmd = [str(Path(sys.executable).with_name("hpolab")), "--store", str(store), "study", "run", "studies/digits_cnn.yaml",
           f"n_trials={trials}", f"parallel={parallel}", f"seed={seed}", f"pruner={PRUNERS[pruner].format(eta=factor)}",
           "trainer.max_epochs=12", "trainer.early_stopping_patience=null"]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="digits-cnn", storage=f"sqlite:///{store / 'optuna.db'}")
    done = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    return {
        "pruner": pruner,
        "reduction_factor": factor,
        "seed": seed,
        "load_before": round(load, 2),
        "trials": len(done),
        "pruned": sum(t.state == TrialState.PRUNED for t in done),
        "epochs": sum(len(t.intermediate_values) for t in done),
        "wall_s": round(wall, 1),
        "best_val_acc": max(max(t.intermediate_values.values()) for t in done),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--pruner", default="successive_halving", choices=[p for p in PRUNERS if p != "none"])
    ap.add_argument("--reduction-factor", type=int, metavar="ETA",
                    help="successive_halving / hyperband reduction factor (default: 4 / 3)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()

    if args.reduction_factor is not None and args.pruner not in DEFAULT_FACTOR:
        ap.error(f"--reduction-factor applies to {' and '.join(DEFAULT_FACTOR)}, not to {args.pruner}")
    factor = args.reduction_factor or DEFAULT_FACTOR.get(args.pruner)
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs; pruner {args.pruner}" + (f", reduction factor {factor}" if factor else ""))
    rows = []
    workdir = Path(tempfile.mkdtemp(prefix="hpolab-bench-"))
    for seed in args.seeds:
        base = run_study("none", seed, args.trials, args.parallel, workdir)
        pruned = run_study(args.pruner, seed, args.trials, args.parallel, workdir, factor)
        rows += [base, pruned]
        print(f"seed {seed}:")
        for r in (base, pruned):
            print(f"  {r['pruner']:>18}: load {r['load_before']:.1f} before, {r['epochs']:4d} epochs, {r['pruned']:2d}/{r['trials']} pruned, "
                  f"{r['wall_s']:6.1f} s, best val_acc {r['best_val_acc']:.4f}")
        print(f"  => {base['epochs'] / pruned['epochs']:.2f}x fewer epochs, {base['wall_s'] / pruned['wall_s']:.2f}x less wall time, "
              f"best val_acc {100 * (pruned['best_val_acc'] - base['best_val_acc']):+.2f} points")
    shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
