"""LR range test benchmark: which suggestion rule lands nearest the LR that actually trains best?

    .venv/bin/python bench/lr_rule.py [--seeds 0 1] [--experiments digits breast_cancer wine] [--points 13]
                                      [--reuse-grid]

For each experiment and seed:
1. the LR range test exactly as `hpolab lr-find` runs it (spec defaults: 1e-7 -> 10, 100 steps,
   EMA smoothing 0.05, diverge_factor 4) with the experiment's trainer;
2. a grid of full trainings (`hpolab.train.fit`, the experiment's trainer, only `lr` changed) at
   `--points` LRs log-spaced over 4 decades; the empirical best LR is the one with the best
   validation accuracy (ties: lower validation loss at that epoch); the "good range" is every grid
   LR within one validation sample of the best accuracy;
3. every rule's suggestion from the same sweep, scored by its distance in decades (log10) to the
   empirical best, and by whether the `from_lr_range_test` bounds built from it
   (s/10 .. min(s*10, divergence LR)) contain the empirical best.

Experiments (all classification: this tree's training routine has no regression task yet):
- digits: experiments/digits_cnn.py with studies/digits_cnn.yaml's trainer (AdamW, cosine, clip 5).
- breast_cancer: sklearn's breast cancer (569 x 30, standardized), an MLP 64-64, AdamW, batch 32.
- wine: sklearn's wine (178 x 13, standardized), an MLP 32-32, SGD momentum 0.9 nesterov, batch 16,
  no clipping (a different optimizer family, where divergence is real).
The seed sets the data split, the initial weights, the batch order, and the sweep's batches.

Prints markdown tables; writes bench/results/lr_rule.json (and lr_rule_grid.json, the grid
trainings, which --reuse-grid reads back so the rules can be re-scored without retraining).
One torch thread throughout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # experiments/
sys.path.insert(0, str(ROOT / "platform"))

from hpolab.train import TrainConfig, fit, seed_everything  # noqa: E402
from hpolab.train.data import DataSplits  # noqa: E402
from hpolab.train.lr_range_test import (  # noqa: E402
    SUGGESTION_RULE, LRRangeResult, bounds_from_lr_range_test, lr_range_test, rule_suggestions)

RESULTS = ROOT / "bench" / "results"


# ---------------------------------------------------------------- tabular experiments (defined here)


def _stratified_split(y: np.ndarray, seed: int, val: float = 0.2, test: float = 0.2):
    rng = np.random.default_rng(seed)
    tr, va, te = [], [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_val, n_test = round(len(idx) * val), round(len(idx) * test)
        va += list(idx[:n_val])
        te += list(idx[n_val : n_val + n_test])
        tr += list(idx[n_val + n_test :])
    return (np.sort(np.array(a)) for a in (tr, va, te))


def tabular_data(name: str, seed: int) -> DataSplits:
    from sklearn import datasets

    bunch = {"breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine}[name]()
    x, y = bunch.data.astype(np.float32), bunch.target.astype(np.int64)
    tr, va, te = _stratified_split(y, seed)
    mean, std = x[tr].mean(0), x[tr].std(0) + 1e-6  # train statistics for every split
    x = (x - mean) / std

    def split(idx):
        return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))

    return DataSplits(train=split(tr), val=split(va), test=split(te), num_classes=int(y.max()) + 1,
                      input_shape=(x.shape[1],), info={"n_train": len(tr), "n_val": len(va)})


def mlp(d_in: int, width: int, classes: int, dropout: float = 0.1) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(width, width), nn.ReLU(), nn.Dropout(dropout), nn.Linear(width, classes))


def experiment(name: str, seed: int):
    """(trainer config, data, model builder, grid of LRs) for one experiment and seed."""
    if name == "digits":
        from hpolab.config.spec import load_experiment, load_spec

        spec = load_spec(ROOT / "studies" / "digits_cnn.yaml")
        exp = load_experiment(spec.experiment)
        resolved = spec.resolved_config(exp)
        data = exp.load_data(resolved["data"], seed)
        return spec.trainer, data, lambda: exp.build_model(resolved["model"], data.input_shape, data.num_classes), (1e-4, 1.0)
    if name == "breast_cancer":
        cfg = TrainConfig(max_epochs=12, batch_size=32, optimizer="adamw", weight_decay=0.01, scheduler="cosine",
                          warmup_epochs=1, grad_clip_norm=5.0, amp="off", device="cpu")
        data = tabular_data(name, seed)
        return cfg, data, lambda: mlp(30, 64, 2), (1e-4, 1.0)
    if name == "wine":
        cfg = TrainConfig(max_epochs=12, batch_size=16, optimizer="sgd", momentum=0.9, nesterov=True, weight_decay=1e-4,
                          scheduler="cosine", warmup_epochs=1, grad_clip_norm=None, amp="off", device="cpu")
        data = tabular_data(name, seed)
        return cfg, data, lambda: mlp(13, 32, 3), (1e-3, 10.0)
    raise ValueError(f"unknown experiment {name!r}")


# ---------------------------------------------------------------- measuring


def grid_trainings(name: str, seed: int, points: int) -> dict:
    cfg, data, build, (lo, hi) = experiment(name, seed)
    lrs = [float(v) for v in np.logspace(math.log10(lo), math.log10(hi), points)]
    rows = []
    for lr in lrs:
        seed_everything(seed)
        model = build()
        t0 = time.perf_counter()
        try:
            out = fit(dataclasses.replace(cfg, lr=lr), model, data, metric="val_acc", direction="maximize", seed=seed)
            best = out.history[out.best_epoch - 1] if out.best_epoch else {}
            acc, vloss = out.best_value, best.get("val_loss", math.inf)
        except Exception as e:  # a NaN loss at a huge LR is a result, not a crash of the benchmark
            acc, vloss = 0.0, math.inf
            print(f"  {name} seed {seed} lr {lr:.3g}: {type(e).__name__}", file=sys.stderr)
        rows.append({"lr": lr, "val_acc": float(acc), "val_loss": float(vloss), "seconds": time.perf_counter() - t0})
    return {"experiment": name, "seed": seed, "n_val": len(data.val), "rows": rows}


def sweep(name: str, seed: int) -> LRRangeResult:
    cfg, data, build, _ = experiment(name, seed)
    seed_everything(seed)
    return lr_range_test(cfg, build(), data, seed=seed)  # the spec's defaults: 1e-7..10, 100 steps


def empirical_best(grid: dict) -> tuple[float, float, float, float]:
    """(best lr, its val_acc, good range low, high)."""
    rows = grid["rows"]
    best = max(rows, key=lambda r: (r["val_acc"], -r["val_loss"]))
    tol = 1.0 / grid["n_val"] + 1e-9  # one validation sample
    good = [r["lr"] for r in rows if r["val_acc"] >= best["val_acc"] - tol]
    return best["lr"], best["val_acc"], min(good), max(good)


def bounds(result: LRRangeResult, s: float) -> tuple[float, float]:
    """The from_lr_range_test bounds had the sweep suggested s (the product's own function)."""
    return bounds_from_lr_range_test(dataclasses.replace(result, suggestion=s))


# ---------------------------------------------------------------- report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--experiments", nargs="+", default=["digits", "breast_cancer", "wine"])
    ap.add_argument("--points", type=int, default=13, help="grid LRs over the 4 decades (13: every 1/3 decade)")
    ap.add_argument("--reuse-grid", action="store_true", help="read the grid trainings from bench/results/lr_rule_grid.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    grid_path = RESULTS / "lr_rule_grid.json"
    cached = {}
    if args.reuse_grid and grid_path.is_file():
        cached = {(g["experiment"], g["seed"]): g for g in json.loads(grid_path.read_text())}

    t_start = time.perf_counter()
    cases = []
    for name in args.experiments:
        for seed in args.seeds:
            t0 = time.perf_counter()
            grid = cached.get((name, seed))
            if grid is None or len(grid["rows"]) != args.points:
                grid = grid_trainings(name, seed, args.points)
            cached[(name, seed)] = grid
            r = sweep(name, seed)
            best_lr, best_acc, good_lo, good_hi = empirical_best(grid)
            rules = rule_suggestions(r)
            cases.append({"experiment": name, "seed": seed, "best_lr": best_lr, "best_acc": best_acc, "good": [good_lo, good_hi],
                          "diverged_at_lr": r.diverged_at_lr, "reason": r.reason, "rules": rules, "suggestion": r.suggestion,
                          "warning": r.warning, "grid": grid["rows"], "sweep_seconds": r.seconds,
                          "lrs": r.lrs, "losses": r.losses, "smoothed": r.smoothed, "result": r})
            print(f"{name} seed {seed}: {time.perf_counter() - t0:.1f}s (sweep {r.seconds:.1f}s); best lr {best_lr:.3g} "
                  f"val_acc {best_acc:.4f}; {r.reason}", file=sys.stderr, flush=True)
    grid_path.write_text(json.dumps(list(cached.values()), indent=1))
    (RESULTS / "lr_rule.json").write_text(json.dumps([{k: v for k, v in c.items() if k != "result"} for c in cases], indent=1))
    total = time.perf_counter() - t_start

    # ---- table 1: the grid and the sweep, per experiment and seed
    print("\n### Grid trainings and the sweep\n")
    print("| experiment | seed | best LR (val_acc) | good range (within 1 val sample) | val_acc at the grid's ends | sweep diverged at |")
    print("| --- | --- | --- | --- | --- | --- |")
    for c in cases:
        g = c["grid"]
        div = f"{c['diverged_at_lr']:.2g}" if c["diverged_at_lr"] else "no"
        print(f"| {c['experiment']} | {c['seed']} | {c['best_lr']:.2g} ({c['best_acc']:.3f}) | {c['good'][0]:.2g} .. {c['good'][1]:.2g} "
              f"| {g[0]['lr']:.0e}: {g[0]['val_acc']:.3f}, {g[-1]['lr']:.0e}: {g[-1]['val_acc']:.3f} | {div} |")

    # ---- table 2: each rule, distance in decades and containment
    names = list(cases[0]["rules"])
    heads = [f"{c['experiment']} s{c['seed']}" for c in cases]
    print("\n### Rules: log10(suggestion / best LR); bounds s/10 .. min(10 s, divergence) contain the best? (in good range?)\n")
    print(f"| rule | {' | '.join(heads)} | mean abs decades | bounds contain best | suggestion in good range |")
    print("| --- |" + " --- |" * (len(heads) + 3))
    summary = {}
    for rule in names:
        cells, dists, contained, good = [], [], 0, 0
        for c in cases:
            s = c["rules"][rule]
            if s is None:
                cells.append("none ✗")
                dists.append(4.0)  # a missing suggestion counts as a 4-decade miss
                continue
            d = math.log10(s / c["best_lr"])
            lo, hi = bounds(c["result"], s)
            inside = lo <= c["best_lr"] * (1 + 1e-9) and c["best_lr"] <= hi * (1 + 1e-9)
            in_good = c["good"][0] / 10 ** (1 / 6) <= s <= c["good"][1] * 10 ** (1 / 6)  # half a grid step of slack
            contained += inside
            good += in_good
            dists.append(abs(d))
            cells.append(f"{d:+.2f} {'✓' if inside else '✗'}{' g' if in_good else ''}")
        summary[rule] = (float(np.mean(dists)), contained, good)
        mark = " (default)" if rule == SUGGESTION_RULE else ""
        print(f"| {rule}{mark} | {' | '.join(cells)} | {np.mean(dists):.2f} | {contained}/{len(cases)} | {good}/{len(cases)} |")
    print(f"\n✓ = the bounds contain the empirical best; g = the suggestion is inside the good range (± half a grid step).")
    fits = sum(len(c["grid"]) for c in cases)
    grid_s = sum(r["seconds"] for c in cases for r in c["grid"])
    print(f"\n{len(cases)} cases, {fits} grid trainings ({grid_s:.0f}s of training, {'reused' if args.reuse_grid else 'run now'}), "
          f"{len(cases)} sweeps ({sum(c['sweep_seconds'] for c in cases):.0f}s); this run {total:.0f}s wall, 1 thread")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
