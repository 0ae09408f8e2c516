"""The promotion race against the plain pick: does racing the leaders on fresh seeds promote a model
that does better on the held-out test split, and what does the race cost?

    PYTHONPATH=platform .venv/bin/python bench/noise.py [--studies 8] [--trials 12] [--digits-epochs 6]
        [--diabetes-epochs 30] [--json FILE] [--plot FILE]

For each experiment (the digits CNN, classification: test accuracy; the diabetes MLP, regression: test
RMSE) and each study seed 0..N-1, one small study runs through the real CLI in a fresh store (its
shipped spec with fewer trials and epochs, `data_seed=0`: every study splits the data the same way, so
the test split is one), then `hpolab promote NAME` races its top 3 trials on 5 fresh seeds (the
defaults) and registers the winner's seed run nearest its mean. Both models are then scored on the
test split by the same code promote's gate uses: the plain pick (the study's best trial by its value
on the study's one seed: its own best checkpoint, what `promote --no-race` registers) and the race's
registered model. Printed per experiment: how often the plain pick is not the race's winner, each
pick's test metric (mean and standard deviation over the studies), and the race's epochs as a share
of the study's. Targets: the race winner's mean test metric at least the plain pick's and its spread
smaller; the race at most 30% of the study's epochs at the defaults.
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
EXPERIMENTS = {  # study name: (spec, the test metric promote gates on, its direction, its epochs option)
    "digits-cnn": ("studies/digits_cnn.yaml", "acc", "maximize", "digits_epochs"),
    "diabetes-mlp": ("studies/diabetes_mlp.yaml", "rmse", "minimize", "diabetes_epochs"),
}


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "OPTUNA_STORAGE", "HPOLAB_STORE")}
    return {**clean, "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def hpolab(store: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "hpolab.cli", "--store", str(store), *args], cwd=ROOT, env=env(), check=True,
                   stdout=subprocess.DEVNULL)


def load() -> float:
    return os.getloadavg()[0]


def test_metric(store: Path, name: str, run_id: str, trial: int, key: str) -> float:
    """The test metric of a run's best checkpoint, scored as promote's gate scores a challenger."""
    from hpolab.registry import evaluation, selection
    from hpolab.stores.mlflow_runs import client_for
    from hpolab.stores.paths import resolve_stores

    stores = resolve_stores(str(store), None, None)
    client = client_for(stores)
    _, info = selection.load_study(name, stores, client)
    ch = selection.Challenger(trial, run_id, 0.0, None)
    with tempfile.TemporaryDirectory() as tmp:
        exp, splits, model, serving, bound = selection.load_challenger(client, stores, info, ch, Path(tmp))
        return float(evaluation.evaluate_challenger(exp, ch.config, splits, model, serving, bound).metrics[key])


def one_study(name: str, seed: int, a) -> dict:
    """A study, its race and both picks' test metrics."""
    import optuna
    from mlflow import MlflowClient

    from hpolab.stores.trial_counts import epochs_used
    from hpolab.study.objectives import ranking

    spec, key, direction, epochs_option = EXPERIMENTS[name]
    with tempfile.TemporaryDirectory(prefix="hpolab-noise-") as tmp:
        store = Path(tmp) / "store"
        t0, load0 = time.perf_counter(), load()
        hpolab(store, "study", "run", spec, f"seed={seed}", "data_seed=0", f"n_trials={a.trials}",
               f"trainer.max_epochs={getattr(a, epochs_option)}", "parallel=2")
        study_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        hpolab(store, "promote", name)
        race_s = time.perf_counter() - t1
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{store / 'optuna.db'}")
        client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}", registry_uri=f"sqlite:///{store / 'mlflow.db'}")
        plain = ranking.best(study.get_trials(), ranking.directions_of(study))
        (version,) = client.search_model_versions(f"name = '{name}'")
        race = study.user_attrs["hpolab.race"]
        winner = int(version.tags["hpolab.trial_number"])
        return {"experiment": name, "seed": seed, "plain_trial": plain.number, "race_winner": winner,
                "plain_test": test_metric(store, name, plain.user_attrs["mlflow_run_id"], plain.number, key),
                "race_test": test_metric(store, name, version.tags["hpolab.trial_run_id"], winner, key),
                "plain_val": plain.value, "race_val_mean": float(version.tags[f"hpolab.race_{study.user_attrs['metric']}_mean"]),
                "study_epochs": epochs_used(study.get_trials()), "race_epochs": int(race["epochs"]),
                "noise_floor": race.get("noise_floor"), "rounds": race["rounds"], "study_s": study_s, "race_s": race_s,
                "load": [load0, load()]}


def summary(rows: list[dict]) -> dict:
    out = {}
    for name, (_, key, direction, _) in EXPERIMENTS.items():
        mine = [r for r in rows if r["experiment"] == name]
        if not mine:
            continue
        plain, race = np.array([r["plain_test"] for r in mine]), np.array([r["race_test"] for r in mine])
        share = sum(r["race_epochs"] for r in mine) / sum(r["study_epochs"] for r in mine)
        better = (race.mean() >= plain.mean()) if direction == "maximize" else (race.mean() <= plain.mean())
        out[name] = {"studies": len(mine), "test": f"test_{key}", "direction": direction,
                     "differs": sum(r["plain_trial"] != r["race_winner"] for r in mine),
                     "plain_mean": float(plain.mean()), "plain_sd": float(plain.std(ddof=1)) if len(mine) > 1 else 0.0,
                     "race_mean": float(race.mean()), "race_sd": float(race.std(ddof=1)) if len(mine) > 1 else 0.0,
                     "race_share": share, "mean_target_met": bool(better),
                     "noise_floor": float(np.mean([r["noise_floor"] for r in mine if r["noise_floor"] is not None] or [np.nan]))}
        out[name]["spread_target_met"] = out[name]["race_sd"] < out[name]["plain_sd"]
    return out


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(EXPERIMENTS), figsize=(10, 4))
    for ax, (name, (_, key, direction, _)) in zip(np.atleast_1d(axes), EXPERIMENTS.items()):
        mine = [r for r in rows if r["experiment"] == name]
        for r in mine:
            colour = "#2b6cb0" if r["plain_trial"] != r["race_winner"] else "#a0aec0"
            ax.plot([0, 1], [r["plain_test"], r["race_test"]], "-o", color=colour, alpha=0.8)
        ax.set_xticks([0, 1], ["plain pick", "race winner"])
        ax.set_xlim(-0.3, 1.3)
        ax.set_title(f"{name}: test_{key} ({direction}), {len(mine)} studies")
        ax.set_ylabel(f"test_{key}")
    fig.suptitle("each line: one study (blue: the race promoted another trial than the plain pick)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--studies", type=int, default=8, help="studies per experiment (study seeds 0..N-1)")
    ap.add_argument("--trials", type=int, default=12, help="n_trials of each study (the shipped specs: 24 and 16)")
    ap.add_argument("--digits-epochs", type=int, default=6, help="trainer.max_epochs of the digits CNN (shipped: 12)")
    ap.add_argument("--diabetes-epochs", type=int, default=30, help="trainer.max_epochs of the diabetes MLP (shipped: 60)")
    ap.add_argument("--experiments", default=",".join(EXPERIMENTS), help="which, comma-separated")
    ap.add_argument("--json", help="write every study's figures and the summary here")
    ap.add_argument("--plot", help="write the plot (PNG) here")
    a = ap.parse_args()
    rows = []
    for name in a.experiments.split(","):
        for seed in range(a.studies):
            r = one_study(name, seed, a)
            rows.append(r)
            print(f"{name} seed {seed}: plain trial {r['plain_trial']} test {r['plain_test']:.4f}; race winner trial "
                  f"{r['race_winner']} test {r['race_test']:.4f}; race {r['race_epochs']} / study {r['study_epochs']} epochs; "
                  f"{r['study_s']:.0f} + {r['race_s']:.0f} s; load {r['load'][0]:.1f}-{r['load'][1]:.1f}", flush=True)
    result = summary(rows)
    for name, s in result.items():
        print(f"{name}: the plain pick is not the race winner in {s['differs']} of {s['studies']} studies; {s['test']}: "
              f"plain {s['plain_mean']:.4f} ± {s['plain_sd']:.4f}, race {s['race_mean']:.4f} ± {s['race_sd']:.4f} "
              f"(mean target {'met' if s['mean_target_met'] else 'NOT met'}, spread target "
              f"{'met' if s['spread_target_met'] else 'NOT met'}); race epochs {s['race_share']:.0%} of the study's "
              f"(target <= 30%: {'met' if s['race_share'] <= 0.30 else 'NOT met'}); noise floor {s['noise_floor']:.4g}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "rows": rows, "summary": result}, indent=1))
    if a.plot:
        plot(rows, a.plot)


if __name__ == "__main__":
    main()
