"""Own-loop overhead: a plain PyTorch loop under hpolab vs the same loop under Optuna + MLflow by hand.

    PYTHONPATH=platform .venv/bin/python bench/own_loop_overhead.py [--trials 12] [--repeats 3]
        [--length 2.0 | --epochs N] [--spec studies/digits_own_loop.yaml] [--json bench/results/own_loop.json]

The loop is the experiment's own `train(config, trial)` (experiments/digits_own_loop.py: its own
optimizer, schedule and checkpoints), run twice per round, each in a fresh temporary store:

(a) by hand, as a practitioner who uses Optuna and MLflow writes it (`--hand` mode of this script, one
    process): `optuna.create_study(...).optimize(objective)`; the objective opens a child run
    `trial-<n>` under a parent run, logs the resolved config as params, and hands the loop a small
    trial object whose `report` logs the epoch's metrics in one batch (step = epoch) and reports the
    study metric to Optuna, whose `checkpoint` writes last.pt (uploaded to `checkpoints/` at the end,
    as hpolab keeps it), whose `is_best` says whether the last epoch improved on the ones before, and
    whose `log_model` keeps the model (the loop gives it its best epoch's), logged after the loop with
    `mlflow.pytorch.log_model` (signature + input example), as hpolab logs it by default.
(b) `hpolab study run SPEC` with the same trials, parallel 1, the same seeded random sampler, no pruner.

Each measurement is the wall time of a whole command, as a user pays it. Rounds alternate the order
(ABBA...) so a drift of the machine's load hits both sides; medians are reported. A short
calibration of (a) sets max_epochs for trials of about --length seconds (--epochs skips it). Per trial:
the cycle (one trial's Optuna start -> the next one's, trial 0 left out: it pays one-off imports; the
target ratio applies to it), the trial duration (start -> complete) and spans between the epochs'
MLflow timestamps, read back from each side's stores; and the whole command's wall time per trial
(start-up and shut-down included). Both sides' stores start from one migrated template (SQLite schemas).
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
SPEC = "studies/digits_own_loop.yaml"
# Identical on both sides: the same configurations, every trial runs all its epochs.
COMMON = ["sampler={type: random}", "pruner={type: none}"]
TARGET = 1.10  # hpolab wall / hand-written wall at trials of ~2 s, parallel 1
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "platform"))


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min, {os.cpu_count()} cores)"


# ------------------------------------------------------------------ (a) the hand-written side


class HandTrial:
    """The trial object a practitioner writes for their loop: MLflow + Optuna calls, nothing else.
    Same members as hpolab's own-loop trial, so the same train() runs unchanged."""

    def __init__(self, trial, client, run_id: str, config: dict, folder: Path, metric: str, maximize: bool = True):
        import torch

        self.number, self.params, self.config = trial.number, dict(trial.params), config
        self.device, self.dir, self.start_epoch = torch.device("cpu"), folder, 1
        self._trial, self._client, self._run_id, self._metric = trial, client, run_id, metric
        self.values: list[float] = []  # the study metric per epoch
        self._maximize = maximize
        self.model = self.example = None
        folder.mkdir(parents=True, exist_ok=True)

    def report(self, epoch: int, metrics: dict[str, float], checkpoint: dict | None = None) -> bool:
        from mlflow.entities import Metric

        if checkpoint is not None:
            self.checkpoint(checkpoint)
        ts = int(time.time() * 1000)
        self._client.log_batch(self._run_id, metrics=[Metric(k, float(v), ts, epoch) for k, v in metrics.items()])
        if self._metric in metrics:
            self.values.append(float(metrics[self._metric]))
            self._trial.report(self.values[-1], epoch)
        return self._trial.should_prune()

    @property
    def is_best(self) -> bool:
        """The last reported value is a strict improvement on every one before it."""
        if not self.values:
            return False
        before, last = self.values[:-1], self.values[-1]
        better = (lambda a, b: a > b) if self._maximize else (lambda a, b: a < b)
        return last == last and all(better(last, v) or v != v for v in before)

    def checkpoint(self, state: dict) -> None:
        import torch

        tmp = self.dir / "last.pt.tmp"
        torch.save(state, tmp)
        os.replace(tmp, self.dir / "last.pt")  # atomic: a crash never leaves half a checkpoint

    def restore(self) -> dict | None:
        return None  # no retries by hand

    def log_model(self, model, input_example) -> None:
        import copy

        self.model, self.example = copy.deepcopy(model).to("cpu").eval(), input_example.detach().to("cpu")


def hand_main(argv: list[str]) -> int:
    """(a): one process, Optuna's study.optimize, MLflow by hand. Writes a JSON summary."""
    ap = argparse.ArgumentParser(prog="own_loop_overhead.py --hand")
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--spec", type=Path, default=ROOT / SPEC)
    ap.add_argument("--summary", type=Path, required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)

    import logging

    import mlflow
    import mlflow.pytorch
    import optuna
    import torch
    from mlflow import MlflowClient
    from mlflow.entities import Param
    from mlflow.models import infer_signature

    from baseline_loop import flatten, make_sampler, pip_requirements, suggest
    from hpolab.config.experiment import load_experiment
    from hpolab.config.spec import load_spec
    from hpolab.train import seed_everything

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_spec(args.spec, args.overrides)
    exp = load_experiment(spec.experiment, search_from=args.spec.parent)
    store = args.store.resolve()
    store.mkdir(parents=True, exist_ok=True)
    tracking_uri = f"sqlite:///{store / 'mlflow.db'}"
    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri)
    experiment_id = client.create_experiment(spec.name, artifact_location=(store / "artifacts").as_uri())
    mlflow.set_experiment(experiment_id=experiment_id)
    # NopPruner: the spec's `pruner: none` (make_sampler refuses any other). Optuna's default is a
    # MedianPruner, which would stop the hand side's below-median trials after an epoch or two while
    # hpolab runs every epoch: the two sides would not train the same epochs.
    study = optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name=spec.name,
                                direction=spec.direction, sampler=make_sampler(spec), pruner=optuna.pruners.NopPruner())
    parent_id = client.create_run(experiment_id, run_name=spec.name, tags={"optuna.study": spec.name}).info.run_id
    train_seconds: list[float] = []

    def objective(trial: optuna.Trial) -> float:
        config = spec.resolved_config(exp, suggest(trial, spec.search_space))
        run_id = client.create_run(experiment_id, run_name=f"trial-{trial.number}", tags={
            "mlflow.parentRunId": parent_id, "optuna.study": spec.name, "optuna.trial_number": str(trial.number)}).info.run_id
        trial.set_user_attr("mlflow_run_id", run_id)
        client.log_batch(run_id, params=[Param(k, v) for k, v in flatten(config).items()])
        hand = HandTrial(trial, client, run_id, config, store / "trials" / f"trial-{trial.number}", spec.metric,
                         spec.direction == "maximize")
        # Seeded as hpolab's trial process seeds it (the model's initial weights come from the global RNG)
        seed_everything(config["seed"], bool(config["trainer"].get("deterministic", False)))
        t0 = time.perf_counter()
        exp.train(config, hand)
        train_seconds.append(time.perf_counter() - t0)
        if (hand.dir / "last.pt").exists():
            client.log_artifact(run_id, str(hand.dir / "last.pt"), "checkpoints")
        if hand.model is not None:
            with torch.inference_mode():
                out = hand.model(hand.example)
            with mlflow.start_run(run_id=run_id):
                mlflow.pytorch.log_model(hand.model, name="model", input_example=hand.example.numpy(),
                                         signature=infer_signature(hand.example.numpy(), out.numpy()),
                                         pip_requirements=pip_requirements())
        client.set_terminated(run_id, "FINISHED")
        return max(hand.values) if spec.direction == "maximize" else min(hand.values)

    study.optimize(objective, n_trials=spec.n_trials)
    client.set_terminated(parent_id, "FINISHED")
    epochs = spec.trainer.max_epochs
    args.summary.write_text(json.dumps({"train_seconds": train_seconds, "epochs": epochs, "best_value": study.best_value}))
    print(f"by hand: {len(study.trials)} trials, mean train() {statistics.mean(train_seconds):.2f} s, best {study.best_value:.4f}")
    return 0


# ------------------------------------------------------------------ one measurement each


def timed(cmd: list[str], log: Path) -> float:
    t0 = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=out, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"own_loop_overhead: {' '.join(cmd[:5])} ... failed with exit code {proc.returncode}; see {log}")
    return wall


def migrated_template(workdir: Path) -> Path:
    """mlflow.db + optuna.db with their schemas created once: each side's store starts from a copy, as
    from an existing store (a fresh MLflow SQLite file costs seconds of migrations, paid once in a
    practitioner's life, not per study; hpolab copies its own template, so the hand side gets one too)."""
    import optuna
    from mlflow import MlflowClient

    template = workdir / "template"
    template.mkdir()
    MlflowClient(f"sqlite:///{template / 'mlflow.db'}").search_experiments()
    optuna.storages.RDBStorage(f"sqlite:///{template / 'optuna.db'}").engine.dispose()
    return template


def run_side(side: str, store: Path, spec: str, trials: int, epochs: int, template: Path, cpus: str | None = None,
             extra: tuple[str, ...] = ()) -> dict:
    overrides = [f"n_trials={trials}", f"trainer.max_epochs={epochs}", *COMMON, *extra]
    store.mkdir(parents=True)
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(template / name, store / name)
    if side == "hand":
        cmd = [sys.executable, str(Path(__file__).resolve()), "--hand", "--store", str(store), "--spec", str(ROOT / spec),
               "--summary", str(store / "summary.json"), *overrides]
    else:
        cmd = [str(Path(sys.executable).with_name("hpolab")), "--store", str(store), "study", "run", spec, "parallel=1", *overrides]
    if cpus:  # both sides on the same CPUs (hpolab gives a trial threads = its CPUs / parallel)
        cmd = ["taskset", "-c", cpus, *cmd]
    wall = timed(cmd, store.parent / f"{store.name}.log")
    m = {"side": side, "wall": wall, "store": str(store), **read_trials(store)}
    if side == "hand":
        m["train_seconds"] = json.loads((store / "summary.json").read_text())["train_seconds"]
    return m


# Per-trial spans (s), read back from both stores the same way. Optuna's datetimes are local wall clock,
# MLflow's run and metric timestamps ms since the epoch: one machine, one clock. The epoch timestamp is
# when the epoch's metrics were logged (by hand: in report(); hpolab: when the driver logs them).
SPANS = {
    "ask_to_run": "Optuna trial start -> MLflow run created",
    "run_to_epoch1": "run created -> epoch 1 logged (hpolab: params, fork, the loop's set-up; both: epoch 1's training)",
    "epochs_2_to_last": "epoch 1 logged -> last epoch logged (training + per-epoch reporting and checkpoints)",
    "last_to_complete": "last epoch logged -> Optuna trial complete (by hand: checkpoint upload + model logging; hpolab: done, tell)",
    "complete_to_next": "Optuna trial complete -> next trial start",
    "trial": "whole trial: Optuna start -> complete",
    "cycle": "per-trial cycle: this trial's start -> the next one's (what each further trial costs a study)",
}


def read_trials(store: Path) -> dict:
    """Per-trial states, params, durations and SPANS (means of trials 1..n-1) from the side's stores."""
    import optuna
    from mlflow import MlflowClient

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{store / 'optuna.db'}"
    (summary,) = optuna.get_all_study_summaries(storage)
    trials = sorted(optuna.load_study(study_name=summary.study_name, storage=storage).trials, key=lambda t: t.number)
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    spans: list[dict[str, float]] = []
    epochs: list[int] = []  # epochs logged per trial: both sides must train the same ones
    for i, t in enumerate(trials):
        if not t.datetime_complete or "mlflow_run_id" not in t.user_attrs:
            continue
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        ts = sorted(m.timestamp / 1000 for m in client.get_metric_history(run.info.run_id, "val_acc"))
        epochs.append(len(ts))
        start, done = t.datetime_start.timestamp(), t.datetime_complete.timestamp()
        row = {"ask_to_run": run.info.start_time / 1000 - start, "run_to_epoch1": ts[0] - run.info.start_time / 1000,
               "epochs_2_to_last": ts[-1] - ts[0], "last_to_complete": done - ts[-1], "trial": done - start}
        if i + 1 < len(trials) and trials[i + 1].datetime_start:
            row["complete_to_next"] = trials[i + 1].datetime_start.timestamp() - done
            row["cycle"] = trials[i + 1].datetime_start.timestamp() - start
        spans.append(row)
    later = spans[1:] or spans  # trial 0 pays one-off imports and warm-ups on both sides
    return {
        "states": [t.state.name for t in trials],
        "durations": [(t.datetime_complete - t.datetime_start).total_seconds() for t in trials if t.datetime_complete],
        "params": [t.params for t in trials],
        "epochs": epochs,
        "spans": {k: statistics.mean(r[k] for r in later if k in r) for k in SPANS if any(k in r for r in later)},
    }


def calibrate(workdir: Path, spec: str, template: Path, cpus: str | None, extra: tuple[str, ...]) -> float:
    """Seconds per epoch of the loop here: 3 trials x 8 epochs by hand (trial 0 pays lazy imports; the
    fastest of the others, as the least disturbed by other work on the machine)."""
    m = run_side("hand", workdir / "calibration", spec, 3, 8, template, cpus, extra)
    return min(m["train_seconds"][1:]) / 8


def per_round(runs: list[dict], key: str) -> list[float]:
    """hpolab / by hand of `key` in each round (runs come in pairs, one per side, in run order)."""
    pairs = [runs[i:i + 2] for i in range(0, len(runs) - 1, 2)]
    return [next(m[key] for m in p if m["side"] == "hpolab") / next(m[key] for m in p if m["side"] == "hand") for p in pairs]


def report(runs: list[dict], trials: int, epochs: int) -> str:
    """The two ratios: per-trial cycle (the target) and whole command, then the per-trial spans."""
    def med(side: str, key: str) -> float:
        return statistics.median(m[key] for m in runs if m["side"] == side)

    for m in runs:
        m["trial_mean"] = statistics.mean(m["durations"][1:] or m["durations"])
        m["cycle"] = m["spans"]["cycle"]
    hand, hp = med("hand", "wall"), med("hpolab", "wall")
    cycle = med("hpolab", "cycle") / med("hand", "cycle")
    lines = [
        "| side | per-trial cycle (median of rounds) | trial duration | whole command wall | wall per trial |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {label} | {med(side, 'cycle'):.2f} s | {med(side, 'trial_mean'):.2f} s | {med(side, 'wall'):.1f} s | "
          f"{med(side, 'wall') / trials:.2f} s |" for side, label in (("hand", "by hand (Optuna optimize + MLflow)"),
                                                                     ("hpolab", "hpolab study run, parallel 1"))),
        "",
        f"per-trial overhead: {med('hpolab', 'cycle') - med('hand', 'cycle'):+.2f} s a trial; ratio hpolab / by hand "
        f"{cycle:.2f}x (target <= {TARGET:.2f}x: {'met' if cycle <= TARGET else 'NOT met'}); whole command "
        f"{hp / hand:.2f}x ({(hp - hand) / trials:+.2f} s a trial, start-up and shut-down included); {trials} trials x {epochs} epochs",
        "per round (hpolab / by hand, each round's two sides back to back): cycle "
        + ", ".join(f"{r:.2f}x" for r in per_round(runs, "cycle")) + "; whole command "
        + ", ".join(f"{r:.2f}x" for r in per_round(runs, "wall")),
        "",
        "| per trial (mean of trials 1..n-1, mean over rounds), s | by hand | hpolab |",
        "| --- | --- | --- |",
    ]
    for key, label in SPANS.items():
        cells = [statistics.mean(m["spans"][key] for m in runs if m["side"] == side and key in m["spans"])
                 if any(key in m["spans"] for m in runs if m["side"] == side) else None for side in ("hand", "hpolab")]
        lines.append(f"| {label} | " + " | ".join("-" if c is None else f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def main() -> int:
    if sys.argv[1:2] == ["--hand"]:
        return hand_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=12, help="trials per study (both sides)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (each: both sides, order alternating); medians reported")
    ap.add_argument("--length", type=float, default=2.0, help="target trial length, s of training (sets max_epochs)")
    ap.add_argument("--epochs", type=int, help="max_epochs per trial, skipping the calibration")
    ap.add_argument("--spec", default=SPEC, help="an own-loop study spec, relative to the project root")
    ap.add_argument("--cpus", help="run both sides on these CPUs only (taskset -c, e.g. 0): on a machine busy with other "
                                   "work, one CPU each avoids the torch thread pool's contention dominating both")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more overrides for both sides, e.g. trainer.batch_size=8 (fewer, longer epochs per trial)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary stores (their path is printed)")
    ap.add_argument("--json", type=Path, help="also write every measurement here")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="hpolab-own-loop-overhead-"))
    print(f"stores under {workdir}; {args.trials} trials per study; spec {args.spec}; CPUs {args.cpus or 'all'}")
    template = migrated_template(workdir)
    epochs = args.epochs
    if epochs is None:
        print(f"calibrating (by hand, 3 trials x 8 epochs); {load()}")
        per_epoch = calibrate(workdir, args.spec, template, args.cpus, tuple(args.set))
        epochs = max(1, round(args.length / per_epoch))
        print(f"  {per_epoch:.3f} s per epoch -> ~{args.length:g} s trials: {epochs} epochs")
    runs: list[dict] = []
    for rep in range(args.repeats):
        plan = ["hand", "hpolab"] if rep % 2 == 0 else ["hpolab", "hand"]  # ABBA
        for side in plan:
            print(f"  round {rep + 1}: {side:7} {load()}", end="", flush=True)
            m = run_side(side, workdir / f"rep{rep}-{side}", args.spec, args.trials, epochs, template, args.cpus, tuple(args.set))
            print(f"  -> {m['wall']:.1f} s ({', '.join(sorted(set(m['states'])))})")
            runs.append(m)
            if not args.keep:
                shutil.rmtree(m["store"], ignore_errors=True)
    if any(m["params"] != runs[0]["params"] for m in runs):
        print("WARNING: the two sides trained different configurations (params differ); the ratio is not comparable")
    if any(m["epochs"] != runs[0]["epochs"] for m in runs):
        print("WARNING: the two sides ran different numbers of epochs per trial; the ratio is not comparable: "
              + "; ".join(f"{m['side']} {m['epochs']}" for m in runs))
    print(f"\n## Own loop: hpolab / by hand, medians of {args.repeats} rounds\n")
    print(report(runs, args.trials, epochs))
    print(f"\n{load()} at the end")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"epochs": epochs, "trials": args.trials, "runs": runs}, indent=1, default=str))
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
