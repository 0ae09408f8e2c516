"""Overhead benchmark: hpolab vs the hand-written Optuna + MLflow loop, side by side in one run.

    PYTHONPATH=platform .venv/bin/python bench/overhead.py [--trials 12] [--repeats 3] [--lengths 0.5 2 5]
        [--parallel 1 2] [--epochs 2 8 20] [--no-log-models [--hpolab-default-models]] [--json bench/results/overhead.json]

Both sides train the same configurations (digits CNN, studies/digits_cnn.yaml, random sampler with
the same seed, no pruning, no early stopping) with the same routine (hpolab.train.fit), each in a fresh
temporary store, and log the same content (bench/baseline_loop.py says what). Each measurement is the
wall time of a whole command, as a user pays it: `hpolab study run ...` vs
`python bench/baseline_loop.py ...` (the baseline always runs one trial at a time).

1. Calibration: a short baseline run measures seconds per epoch on this machine, which sets
   max_epochs for trials of about --lengths seconds (or give --epochs explicitly).
2. For each length: --repeats rounds of [baseline, hpolab parallel=1, hpolab parallel=2], the order
   reversed every other round (ABBA...) so a drift in machine load hits both sides; medians per side.
3. Ratio table (hpolab wall / baseline wall) with the targets, and a per-trial
   attribution of where each side's time goes, read back from what the stores record.
The machine load (os.getloadavg, 1/5/15 min) is printed before each measurement: a run started on
a busy machine shows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = "studies/digits_cnn.yaml"
# Identical on both sides: what makes the two runs train the same configurations.
COMMON = ["sampler={type: random}", "pruner={type: none}", "trainer.early_stopping_patience=null"]
# Targets: hpolab wall / baseline wall, keyed by (parallel, trial length in s). Models
# logged on both sides; or a baseline that logs no model, hpolab with log_models none or its default.
TARGETS = {(1, 2.0): 1.10, (1, 0.5): 1.25, (2, 2.0): 0.85}
TARGETS_NO_MODELS = {(1, 2.0): 1.10, (2, 2.0): 0.80}
TARGETS_DEFAULT_MODELS = {(1, 2.0): 1.15, (2, 2.0): 0.80}  # docs/benchmarks.md#overhead: <= 1.15x


def env(root: Path = ROOT) -> dict[str, str]:
    # This worktree's hpolab (or --compare-root's), whatever is installed in the venv.
    return {**os.environ, "PYTHONPATH": f"{root / 'platform'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min, {os.cpu_count()} cores)"


def hpolab_has_log_models_knob() -> bool:
    """hpolab logs every COMPLETE trial's model; a later version may add a `log_models:` spec key."""
    sys.path.insert(0, str(ROOT / "platform"))
    from hpolab.config.spec import StudySpec

    return "log_models" in StudySpec.model_fields


# ------------------------------------------------------------------ one measurement each


def timed(cmd: list[str], log: Path, root: Path = ROOT) -> tuple[float, float, float]:
    """Run cmd from the project root; (wall s, start, end as time.time()). Output goes to `log`."""
    t_start, t0 = time.time(), time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=root, env=env(root), stdout=out, stderr=subprocess.STDOUT)
    wall, t_end = time.perf_counter() - t0, time.time()
    if proc.returncode != 0:
        sys.exit(f"overhead: {' '.join(cmd[:4])} ... failed with exit code {proc.returncode}; see {log}")
    return wall, t_start, t_end


def run_baseline(store: Path, trials: int, epochs: int, log_models: bool) -> dict:
    cmd = [sys.executable, str(ROOT / "bench" / "baseline_loop.py"), "--store", str(store), "--summary", str(store / "summary.json"),
           *(["--log-models"] if log_models else []), f"n_trials={trials}", f"trainer.max_epochs={epochs}", *COMMON]
    wall, t_start, t_end = timed(cmd, store.parent / f"{store.name}.log")
    summary = json.loads((store / "summary.json").read_text())
    return {"side": "baseline", "parallel": 1, "wall": wall, "t_start": t_start, "t_end": t_end, "store": store,
            "fit_seconds": summary["fit_seconds"], "epochs": summary["epochs"]}


def run_hpolab(store: Path, trials: int, epochs: int, parallel: int, log_models: bool | None, root: Path = ROOT,
               side: str = "hpolab") -> dict:
    # log_models None: hpolab's default (no knob, or --hpolab-default-models)
    knob = [] if log_models is None else [f"log_models={'complete' if log_models else 'none'}"]
    cmd = [str(Path(sys.executable).with_name("hpolab")), "--store", str(store), "study", "run", SPEC,
           f"n_trials={trials}", f"parallel={parallel}", f"trainer.max_epochs={epochs}", *COMMON, *knob]
    store.mkdir(parents=True)
    wall, t_start, t_end = timed(cmd, store.parent / f"{store.name}.log", root)
    return {"side": side, "parallel": parallel, "wall": wall, "t_start": t_start, "t_end": t_end, "store": store}


# ------------------------------------------------------------------ reading the stores back


def trials_and_runs(store: Path) -> list[tuple]:
    """[(optuna trial, mlflow run, [(epoch ts s, epoch_seconds)...])] of the COMPLETE trials, by number."""
    import optuna
    from mlflow import MlflowClient

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="digits-cnn", storage=f"sqlite:///{store / 'optuna.db'}")
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    out = []
    for t in sorted(study.trials, key=lambda t: t.number):
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        # Every metric of an epoch is logged in one batch with one timestamp (ms): the moment the
        # logger received that epoch. epoch_seconds = that epoch's train + validation time in fit().
        hist = sorted(client.get_metric_history(run.info.run_id, "epoch_seconds"), key=lambda m: m.step)
        out.append((t, run, [(m.timestamp / 1000, m.value) for m in hist]))
    return out


def params_of(store: Path) -> list[dict]:
    return [t.params for t, _, _ in trials_and_runs(store)]


# Per-trial buckets (seconds), in the order a trial lives them. Optuna's datetimes are local wall
# clock (microseconds), MLflow's run and metric timestamps are ms since the epoch: one machine, one clock.
BUCKETS = {
    "ask_to_run": "Optuna trial start (ask) -> MLflow run created",
    "run_to_training": "run created -> epoch 1 training starts (params + config logging, process start, data + model build, fit set-up)",
    "training": "training: sum of epoch_seconds (train + validation)",
    "per_epoch": "epochs 2..E: gaps between epoch logs minus epoch_seconds (checkpoint write, epoch logging, report, round trip)",
    "last_epoch_to_tell": "last epoch logged -> Optuna trial complete (done message, best.pt upload, tell; the baseline also logs the model here)",
    "tell_to_next": "Optuna trial complete -> next trial start (next ask; parallel=1 only)",
    "trial_total": "whole trial: Optuna start -> complete",
    "last_epoch_to_run_end": "last epoch logged -> MLflow run end (incl. model logging; in hpolab after tell, in the background)",
}


def attribution(m: dict) -> dict[str, float]:
    """Mean seconds per trial in each bucket, trial 0 left out of the means (it pays one-off warm-ups:
    hpolab's forkserver import, the baseline's lazy torch imports), plus study-level spans."""
    rows = trials_and_runs(m["store"])
    per_trial: list[dict[str, float]] = []
    for i, (t, run, epochs) in enumerate(rows):
        start, done = t.datetime_start.timestamp(), t.datetime_complete.timestamp()
        run_start, run_end = run.info.start_time / 1000, run.info.end_time / 1000
        ts = [e[0] for e in epochs]
        es = [e[1] for e in epochs]
        b = {
            "ask_to_run": run_start - start,
            "run_to_training": ts[0] - es[0] - run_start,
            "training": sum(es),
            "per_epoch": sum(ts[k] - ts[k - 1] - es[k] for k in range(1, len(ts))),
            "last_epoch_to_tell": done - ts[-1],
            "trial_total": done - start,
            "last_epoch_to_run_end": run_end - ts[-1],
        }
        if m["parallel"] == 1 and i + 1 < len(rows):
            b["tell_to_next"] = rows[i + 1][0].datetime_start.timestamp() - done
        per_trial.append(b)
    later = per_trial[1:] or per_trial
    means = {k: statistics.mean(b[k] for b in later if k in b) for k in BUCKETS if any(k in b for b in later)}
    first_start = rows[0][0].datetime_start.timestamp()
    last_done = max(t.datetime_complete.timestamp() for t, _, _ in rows)
    last_run_end = max(r.info.end_time / 1000 for _, r, _ in rows)
    means.update({
        "trial0_run_to_training": per_trial[0]["run_to_training"],
        "process_to_first_trial": first_start - m["t_start"],
        "last_tell_to_last_run_end": last_run_end - last_done,
        "last_run_end_to_exit": m["t_end"] - last_run_end,
        "wall": m["wall"],
    })
    return means


STUDY_SPANS = {
    "trial0_run_to_training": "trial 0: run created -> epoch 1 training starts (hpolab: first fork waits for the forkserver)",
    "process_to_first_trial": "command start -> first trial start (interpreter, imports, stores, forkserver start)",
    "last_tell_to_last_run_end": "last trial complete -> last MLflow run end (queued model logging)",
    "last_run_end_to_exit": "last run end -> command exit (parent run close, shutdown)",
    "wall": "wall time of the whole command",
}


# ------------------------------------------------------------------ calibration and report


def calibrate(workdir: Path, log_models: bool) -> float:
    """Seconds per epoch of the digits CNN here (mean over the search space's channel widths)."""
    m = run_baseline(workdir / "calibration", trials=4, epochs=3, log_models=log_models)
    fits, epochs = m["fit_seconds"][1:], m["epochs"][1:]  # trial 0 pays torch's lazy imports
    return sum(fits) / sum(epochs)


def fmt(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:.2f}{unit}"


def ratio_table(results: dict, lengths: list[float], parallels: list[int], targets: dict) -> str:
    head = ["trial length (target)", "epochs", "baseline fit s/trial", "baseline wall"]
    for p in parallels:
        head += [f"hpolab p={p} wall", f"ratio p={p}", f"target p={p}"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for length in lengths:
        r = results[length]
        base = statistics.median(m["wall"] for m in r["runs"] if m["side"] == "baseline")
        fit = statistics.mean(s for m in r["runs"] if m["side"] == "baseline" for s in m["fit_seconds"][1:] or m["fit_seconds"])
        row = [f"~{length:g} s", str(r["epochs"]), fmt(fit, " s"), fmt(base, " s")]
        for p in parallels:
            hp = statistics.median(m["wall"] for m in r["runs"] if m["side"] == "hpolab" and m["parallel"] == p)
            target = targets.get((p, length))
            ratio = hp / base
            verdict = "-" if target is None else f"<= {target:.2f}x {'met' if ratio <= target else 'NOT met'}"
            row += [fmt(hp, " s"), f"{ratio:.2f}x", verdict]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def attribution_table(results: dict, length: float, parallels: list[int]) -> str:
    sides = [("baseline", 1)] + [("hpolab", p) for p in parallels]
    means = {}
    for side, p in sides:
        atts = [m["attribution"] for m in results[length]["runs"] if m["side"] == side and m["parallel"] == p]
        keys = set().union(*atts)
        means[(side, p)] = {k: statistics.mean(a[k] for a in atts if k in a) for k in keys}
    head = ["per trial (mean of trials 1..n-1), s"] + [f"{s} p={p}" if s == "hpolab" else s for s, p in sides]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key, label in BUCKETS.items():
        lines.append("| " + " | ".join([label] + [fmt(means[sp].get(key)) for sp in sides]) + " |")
    lines.append("| **per study**, s | " + " | ".join("" for _ in sides) + " |")
    for key, label in STUDY_SPANS.items():
        lines.append("| " + " | ".join([label] + [fmt(means[sp].get(key)) for sp in sides]) + " |")
    return "\n".join(lines)


NOT_VISIBLE = """\
Not visible from the stores (would need driver timing tags):
- inside "run created -> training starts": hpolab's params + config.yaml logging vs the fork vs the
  child's data/model build vs fit's set-up (only their sum is recorded);
- inside the per-epoch gap: the child's checkpoint write vs the pipe round trip vs the driver's MLflow
  write, Optuna report/should_prune and heartbeat (the epoch timestamp is taken when the driver starts
  logging that epoch, so time the driver spends busy elsewhere -- another trial's messages, a blocking
  join or upload -- also lands here, at parallel=2 especially);
- inside "last epoch -> complete": the done message and process join vs the best.pt upload vs tell;
- hpolab's model logging: its run ends after the model is logged by a background thread, but when that
  thread started (queue wait) and how long export vs upload took is not recorded;
- inside "complete -> next start": the stale-trial reaper, the budget lock and trial count vs ask itself;
- the driver loop's blocked time (wait(..., timeout=1.0) slices, join(timeout=30)) as such.
At parallel=2 the per-trial buckets overlap across trials; only their sizes, not their sum, compare to wall."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=12, help="trials per study (both sides)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per trial length; medians are reported")
    ap.add_argument("--lengths", type=float, nargs="+", default=[0.5, 2.0, 5.0], help="target trial lengths, s of training")
    ap.add_argument("--epochs", type=int, nargs="+", help="max_epochs per length, skipping the calibration")
    ap.add_argument("--parallel", type=int, nargs="+", default=[1, 2], help="hpolab parallel settings")
    ap.add_argument("--no-log-models", dest="log_models", action="store_false",
                    help="log no models on either side (needs an hpolab with a log_models: spec key)")
    ap.add_argument("--hpolab-default-models", action="store_true",
                    help="hpolab keeps its default model logging (no log_models= override) whatever the baseline "
                         "does: with --no-log-models, 'default logging vs a loop that logs none'")
    ap.add_argument("--compare-root", type=Path,
                    help="also run this checkout's hpolab (e.g. an earlier commit unpacked with git archive) in every "
                         "round at parallel 1: before and after under the same load")
    ap.add_argument("--keep", action="store_true", help="keep the temporary stores (their path is printed)")
    ap.add_argument("--json", type=Path, help="also write every measurement here (e.g. bench/results/overhead.json)")
    args = ap.parse_args()
    if args.epochs and len(args.epochs) != len(args.lengths):
        ap.error("--epochs needs one value per --lengths value")

    knob = hpolab_has_log_models_knob()
    if not args.log_models and not knob:
        sys.exit("overhead: this hpolab always logs the model of every COMPLETE trial (no `log_models:` spec key), "
                 "so the baseline must too: drop --no-log-models")
    hp_log_models = args.log_models if knob and not args.hpolab_default_models else None

    workdir = Path(tempfile.mkdtemp(prefix="hpolab-overhead-"))
    models = "yes" if args.log_models else "no"
    print(f"stores under {workdir}; {args.trials} trials per study; models logged by the baseline: {models}, "
          f"by hpolab: {'its default (the spec log_models)' if hp_log_models is None else models}")
    if args.epochs:
        epochs_for = dict(zip(args.lengths, args.epochs))
    else:
        print(f"calibrating (baseline, 4 trials x 3 epochs); {load()}")
        per_epoch = calibrate(workdir, args.log_models)
        epochs_for = {length: max(1, round(length / per_epoch)) for length in args.lengths}
        print(f"  {per_epoch:.3f} s per epoch -> " + ", ".join(f"~{length:g} s: {e} epochs" for length, e in epochs_for.items()))

    results: dict[float, dict] = {}
    for length in args.lengths:
        epochs = epochs_for[length]
        results[length] = {"epochs": epochs, "runs": []}
        print(f"\n## trials of ~{length:g} s: max_epochs={epochs}")
        for rep in range(args.repeats):
            plan = [("baseline", 1)] + [("hpolab", p) for p in args.parallel]
            if args.compare_root:
                plan.append(("compared", 1))
            if rep % 2:
                plan.reverse()  # ABBA: a drifting load hits both sides alike
            for side, p in plan:
                store = workdir / f"len{length:g}-rep{rep}-{side}-p{p}"
                print(f"  round {rep + 1}: {side:8} p={p}  {load()}", end="", flush=True)
                if side == "baseline":
                    m = run_baseline(store, args.trials, epochs, args.log_models)
                elif side == "compared":
                    m = run_hpolab(store, args.trials, epochs, p, hp_log_models, args.compare_root.resolve(), side)
                else:
                    m = run_hpolab(store, args.trials, epochs, p, hp_log_models)
                m["attribution"] = attribution(m)
                m["params"] = params_of(store)
                print(f"  -> {m['wall']:.1f} s")
                results[length]["runs"].append(m)
                if not args.keep:
                    shutil.rmtree(store, ignore_errors=True)
        # Same configurations on both sides: the seeded random sampler must have proposed the same params.
        params = [m["params"] for m in results[length]["runs"]]
        if any(p != params[0] for p in params):
            print("  WARNING: the two sides trained different configurations (params differ); ratios are not comparable")

    print("\n## Wall time, hpolab / hand-written loop (medians of", args.repeats, "rounds)\n")
    if args.log_models:
        targets = TARGETS
    else:
        targets = TARGETS_DEFAULT_MODELS if hp_log_models is None else TARGETS_NO_MODELS
    print(ratio_table(results, args.lengths, args.parallel, targets))
    if args.compare_root:
        for length in args.lengths:
            runs = results[length]["runs"]
            base = statistics.median(m["wall"] for m in runs if m["side"] == "baseline")
            walls = {s: statistics.median(m["wall"] for m in runs if m["side"] == s and m["parallel"] == 1)
                     for s in ("hpolab", "compared")}
            print(f"\n~{length:g} s, p=1: this checkout {walls['hpolab']:.1f} s ({walls['hpolab'] / base:.2f}x), "
                  f"{args.compare_root} {walls['compared']:.1f} s ({walls['compared'] / base:.2f}x), baseline {base:.1f} s")
    for length in args.lengths:
        print(f"\n## Where the time goes, trials of ~{length:g} s (max_epochs={results[length]['epochs']}), means over rounds\n")
        print(attribution_table(results, length, args.parallel))
    print("\n" + NOT_VISIBLE)
    print(f"\n{load()} at the end")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        rows = [{k: (str(v) if isinstance(v, Path) else v) for k, v in m.items() if k != "params"}
                | {"length": length, "epochs": results[length]["epochs"]}
                for length in args.lengths for m in results[length]["runs"]]
        args.json.write_text(json.dumps(rows, indent=1))
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
