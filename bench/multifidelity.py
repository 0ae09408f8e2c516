"""Multi-fidelity benchmark: random search vs Optuna's Hyperband pruner vs hpolab ASHA vs PBT, side by side.

    nice -n 10 .venv/bin/python bench/multifidelity.py [--seeds 0 1 2] [--trials 12] [--arms random hyperband asha pbt]
        [--json bench/results/multifidelity.json] [--plot docs/img/multifidelity.png] [--markdown bench/results/multifidelity.md]
        [--compare-root DIR]

Every arm is one `hpolab study run studies/bench_multifidelity.yaml` through the real CLI in a fresh
temporary store, with the same sampler seed per seed round (random sampler: the arms draw the same
configurations in the same order), the same task (a small MLP on the 8x8 digits, SGD at a constant LR,
27 epochs) and the same epoch budget, `budget: {epochs: 27 x --trials}` = what random search trains:

  random     --trials configurations, each trained to 27 epochs (no pruning)
  hyperband  3 x --trials configurations under Optuna's HyperbandPruner (min 1, max 27, factor 3): a
             pruned trial's epochs are thrown away
  asha       3 x --trials configurations under `trial_scheduler: {type: asha}` (rungs 1, 3, 9, 27,
             factor 3): a trial pauses at its rung and resumes from its checkpoint when promoted
  pbt        a population of --trials members (the same first configurations as `random`) under
             `trial_scheduler: {type: pbt}`: every 3 epochs the bottom quarter copies a top-quarter
             member's checkpoint and multiplies its lr by 0.5 or 2. `random` is the same population
             with exploit/explore off, i.e. the fixed (constant-LR) schedule PBT must beat: with SGD at a
             constant LR a high LR learns fastest early and a lower one wins late.

Read back from the stores (MLflow metric histories of each trial's run, Optuna for the trials): the
best val_acc of any epoch of any trial; the epochs trained (distinct (trial, epoch) pairs: a resumed
ASHA trial continues its one run, so its segments count once); the epochs trained, in the order the
driver received them, until the arm first reached random search's best - 0.5 points of the same seed;
the wall time of the command and the driver's CPU time (the CLI process, its loop and threads; the
trial processes come from the forkserver, which nobody waits for, and are not in it). With --compare-root DIR each seed's arms run twice, side by side, in
alternating order: with DIR's hpolab ("before") and this checkout's ("after"); the header then gives
each one's ASHA wall (and driver CPU) time over random search's, per seed. The header also splits each
study's wall time into its start (the command's start to the first trial's run), its trials (to the last
epoch received) and its end, and gives the least ASHA's ratio could be on those figures: random search's
start and end, and each ASHA epoch at what random's epochs cost in its trials phase, with no further cost
per trial or segment. An arm the CLI refuses (exit 2: its spec key does not exist yet) is
reported as missing. The load average is recorded before each study.

    nice -n 10 .venv/bin/python bench/multifidelity.py --pbt-task lr-decay [--seeds 0 1 2] [--json ...] [--markdown ...]

runs PBT against fixed schedules on studies/bench_lr_decay.yaml instead (a task whose best LR changes
during training; val_loss, minimised), three arms per seed: `schedules` (a grid: lr 0.03, 0.1, 0.3, 1,
each constant and stepped down x0.1 after epoch 12: the task's property), `random` (the population at
constant LRs: the fixed schedule) and `pbt` (the same population under PBT, lr x0.5 or x2 every 3
epochs); per seed the table gives each one's best and the winning PBT member's lr schedule.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import ROOT, env, load  # noqa: E402  (this checkout's hpolab, the load line)

SPEC = "studies/bench_multifidelity.yaml"
STUDY = "bench-multifidelity"
MAX_EPOCHS = 27
TARGET_POINTS = 0.5  # ASHA must reach random search's best within this many points of accuracy
ARMS = ("random", "hyperband", "asha", "pbt")
SCHEDULE_LRS = (0.03, 0.1, 0.3, 1.0)  # the lr-decay task's fixed schedules: each constant and stepped down
TASKS = {
    "digits": {"spec": SPEC, "study": STUDY, "metric": "val_acc", "maximize": True, "epochs": MAX_EPOCHS, "arms": ARMS},
    "lr-decay": {"spec": "studies/bench_lr_decay.yaml", "study": "bench-lr-decay", "metric": "val_loss",
                 "maximize": False, "epochs": 18, "arms": ("schedules", "random", "pbt")},
}


def arm_overrides(arm: str, trials: int, epochs: int = MAX_EPOCHS) -> list[str]:
    """The spec overrides of one arm; every arm gets the same epoch budget (what random search trains)."""
    budget = f"budget={{epochs: {epochs * trials}}}"
    if arm == "schedules":  # the lr-decay task's grid: every lr of SCHEDULE_LRS constant, and stepped down
        lrs = ", ".join(str(lr) for lr in SCHEDULE_LRS)
        return [f"n_trials={2 * len(SCHEDULE_LRS)}", "sampler={type: grid}",
                f"search_space={{trainer.lr: {{type: categorical, choices: [{lrs}]}}, "
                "trainer.scheduler: {type: categorical, choices: [none, step]}}"]
    if arm == "random":
        return [f"n_trials={trials}", budget]
    if arm == "hyperband":
        return [f"n_trials={3 * trials}", budget,
                f"pruner={{type: hyperband, kwargs: {{min_resource: 1, max_resource: {MAX_EPOCHS}, reduction_factor: 3}}}}"]
    if arm == "asha":
        return [f"n_trials={3 * trials}", budget,
                f"trial_scheduler={{type: asha, min_epochs: 1, max_epochs: {MAX_EPOCHS}, reduction_factor: 3, brackets: 1}}"]
    if arm == "pbt":
        return [f"n_trials={trials}", budget,
                f"trial_scheduler={{type: pbt, population: {trials}, interval_epochs: 3, quantile: 0.25, "
                "mutations: {trainer.lr: {factor: [0.5, 2.0]}}}"]
    raise ValueError(f"unknown arm {arm!r}")


# ------------------------------------------------------------------ pure parts (tested without training)


def epochs_of(histories: dict[int, list[tuple[float, int, float]]]) -> list[tuple[float, int, int, float]]:
    """{trial number: [(timestamp s, epoch, value)...]} -> [(timestamp, trial, epoch, value)] in the order the
    driver received them, each (trial, epoch) once (its first report: a resumed trial's epochs are never
    trained twice, but a retried copy's re-reported history must not count again)."""
    seen: dict[tuple[int, int], tuple[float, int, int, float]] = {}
    for number, points in histories.items():
        for ts, epoch, value in points:
            key = (number, epoch)
            if key not in seen or ts < seen[key][0]:
                seen[key] = (ts, number, epoch, value)
    return sorted(seen.values(), key=lambda e: (e[0], e[1], e[2]))


def summarise(events: list[tuple[float, int, int, float]], target: float | None, maximize: bool = True) -> dict:
    """Best value, epochs trained and epochs until the first value at least as good as `target` (None: never)."""
    better = (lambda v, t: v >= t) if maximize else (lambda v, t: v <= t)
    values = [e[3] for e in events]
    best = (max if maximize else min)(values) if values else None
    to_target = None
    if target is not None:
        to_target = next((i + 1 for i, v in enumerate(values) if better(v, target)), None)
    return {"best": best, "epochs": len(events), "epochs_to_target": to_target}


def best_so_far(events: list, maximize: bool = True) -> list[float]:
    """The best value seen after each epoch (the curve the plot draws against epochs trained); an event
    ends with its value ((timestamp, trial, epoch, value) or, as saved, [trial, epoch, value])."""
    out: list[float] = []
    for e in events:
        out.append(e[-1] if not out else (max if maximize else min)(out[-1], e[-1]))
    return out


def mean_sd(xs: list[float | None]) -> tuple[float | None, float | None, int]:
    """(mean, sd, how many) of the values that exist; sd 0 for one value."""
    vals = [x for x in xs if x is not None]
    if not vals:
        return None, None, 0
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0), len(vals)


def trial_best(histories: dict[int, list[tuple[float, int, float]]], maximize: bool = True) -> list[list]:
    """[[trial, its best value, the epoch of it]] of every trial with a history."""
    pick = max if maximize else min
    out = []
    for number, points in sorted(histories.items()):
        if points:
            _, epoch, value = pick(points, key=lambda p: (p[2], -p[1]) if maximize else (p[2], p[1]))
            out.append([number, value, epoch])
    return out


def phases(started: float, wall: float, first_run: float | None, events: list) -> dict | None:
    """A study command's wall time in three parts, s: `start` (the command's start to its first trial's
    run: imports, the spec check, the stores, the forkserver), `trials` (to the last epoch the driver
    received) and `end` (to the command's exit: what is ended at the end, the summary). `started`:
    the command's start (s since the epoch); events as epochs_of gives them."""
    if first_run is None or not events:
        return None
    last = max(e[0] for e in events)
    return {"start": round(first_run - started, 2), "trials": round(last - first_run, 2),
            "end": round(started + wall - last, 2)}


def free_segments_ratio(random: dict, asha: dict) -> float | None:
    """ASHA's wall over random search's if each of ASHA's epochs cost what random's cost in random's
    trials phase, and nothing more (no cost per trial or per segment beyond random's), with random's start
    and end: the least the ratio can be on this run's figures."""
    ph = random.get("phases")
    if not ph or not random.get("epochs") or not asha.get("epochs"):
        return None
    return (ph["start"] + ph["end"] + ph["trials"] * asha["epochs"] / random["epochs"]) / random["wall_s"]


def _by_trial(mapping: dict, trial: int):  # int keys when fresh, str keys read back from JSON
    return mapping.get(trial, mapping.get(str(trial)))


def lr_decay_summary(rows: list[dict], maximize: bool = False) -> list[dict]:
    """Per seed of the lr-decay task: the best [value, lr] of the grid's constant and stepped-down schedules,
    of the fixed population (the random arm), and PBT's best [value, member, epoch] with that member's lr
    schedule ([[epoch from, lr]]); None where the arm is missing."""
    better = (lambda a, b: a > b) if maximize else (lambda a, b: a < b)
    out = []
    for seed in sorted({r["seed"] for r in rows}):
        got = {"seed": seed, "constant": None, "step_down": None, "fixed": None, "pbt": None, "pbt_schedule": None}
        for r in [r for r in rows if r["seed"] == seed and "trial_best" in r]:
            for trial, value, epoch in r["trial_best"]:
                params = _by_trial(r["params"], trial)
                if r["arm"] == "schedules":
                    slot = "step_down" if params["trainer.scheduler"] == "step" else "constant"
                else:
                    slot = "fixed" if r["arm"] == "random" else r["arm"]
                if got.get(slot) is None or better(value, got[slot][0]):
                    got[slot] = [value, trial, epoch] if slot == "pbt" else [value, params["trainer.lr"]]
            if r["arm"] == "pbt" and got["pbt"] is not None:
                got["pbt_schedule"] = [list(p) for p in _by_trial(r["lr_schedules"], got["pbt"][1]) or []]
        out.append(got)
    return out


def schedule_text(schedule: list | None) -> str:
    """[[epoch from, lr]...] -> '0.02 → 0.2 @4 → 0.05 @13' (a repeated lr, logged at a resume, is left out)."""
    parts, last = [], None
    for epoch, lr in schedule or []:
        if lr != last:
            parts.append(f"{lr:.3g}" if last is None else f"{lr:.3g} @{epoch:.0f}")
            last = lr
    return " → ".join(parts) or "-"


def lr_decay_table(summary: list[dict]) -> str:
    def cell(x, lr=True):
        return "-" if x is None else (f"{x[0]:.4f} (lr {x[1]:.3g})" if lr else f"{x[0]:.4f} (epoch {x[2]})")

    lines = ["| seed | best constant lr (grid) | step-down x0.1 after epoch 12 (grid) | fixed population | PBT | "
             "PBT - fixed | PBT winner's lr (from epoch) |", "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for s in summary:
        gap = f"{s['pbt'][0] - s['fixed'][0]:+.4f}" if s["pbt"] and s["fixed"] else "-"
        lines.append(f"| {s['seed']} | {cell(s['constant'])} | {cell(s['step_down'])} | {cell(s['fixed'])} | "
                     f"{cell(s['pbt'], lr=False)} | {gap} | {schedule_text(s['pbt_schedule'])} |")
    cols = [mean_sd([s[k][0] if s[k] else None for s in summary]) for k in ("constant", "step_down", "fixed", "pbt")]
    gaps = mean_sd([s["pbt"][0] - s["fixed"][0] if s["pbt"] and s["fixed"] else None for s in summary])
    fmt = [f"{m:.4f} ± {sd:.4f}" if m is not None else "-" for m, sd, _ in [*cols, gaps]]
    lines.append(f"| mean ± sd | {' | '.join(fmt)} | |")
    return "\n".join(lines)


# ------------------------------------------------------------------ running and reading the stores


def run_arm(arm: str, seed: int, trials: int, workdir: Path, task: dict = TASKS["digits"], root: Path = ROOT,
            code: str | None = None) -> dict:
    """One study through the real CLI in its own store (the hpolab of checkout `root`); {'refused': line}
    when the CLI refuses the arm's spec."""
    store = workdir / f"{arm}-seed{seed}" if code is None else workdir / f"{arm}-seed{seed}-{code}"
    cmd = [str(Path(sys.executable).with_name("hpolab")), "--store", str(store), "study", "run", task["spec"],
           f"seed={seed}", *arm_overrides(arm, trials, task["epochs"])]
    before = load()
    log = store.with_name(store.name + ".log")
    started, t0, cpu0 = time.time(), time.perf_counter(), children_cpu()
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=root, env=env(root), stdout=out, stderr=subprocess.STDOUT)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    text = log.read_text()
    if proc.returncode == 2:
        return {"arm": arm, "seed": seed, "refused": text.strip().splitlines()[-1] if text.strip() else "exit 2"}
    got = read_store(store, task["study"], task["metric"]) if proc.returncode in (0, 1) else {"states": {}}
    # Exit 1 is also how `study run` ends when budget.epochs stops it early or when ASHA pruned every
    # trial at a rung (no COMPLETE trial): an arm's result, as long as no trial failed or is left running.
    if proc.returncode != 0 and not (proc.returncode == 1 and got["states"] and set(got["states"]) <= {"COMPLETE", "PRUNED"}):
        sys.exit(f"multifidelity: {arm} seed {seed} failed with exit code {proc.returncode}; see {log}")
    return {"arm": arm, "seed": seed, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_before": before, "store": store,
            "started": started,
            "exit_code": proc.returncode, "last_line": text.strip().splitlines()[-1] if text.strip() else "", **got}


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children and what they waited for: a
    study's driver (its loop and threads; not the trial processes, which its forkserver forks)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def read_store(store: Path, study_name: str = STUDY, metric: str = "val_acc") -> dict:
    """The metric history of every trial's MLflow run, and the trials' final states from Optuna."""
    import optuna
    from mlflow import MlflowClient

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{store / 'optuna.db'}")
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    histories, states, params, schedules, exploited = {}, {}, {}, {}, 0
    starts = []  # when each trial's run was created (s since the epoch)
    for t in study.trials:
        states[t.state.name] = states.get(t.state.name, 0) + 1
        params[t.number] = t.params  # the sampled configuration: the same first ones in every arm of a seed
        run_id = t.user_attrs.get("mlflow_run_id")
        if run_id:
            hist = client.get_metric_history(run_id, metric)
            histories[t.number] = [(m.timestamp / 1000, m.step, m.value) for m in hist]
            run = client.get_run(run_id)
            exploited += "hpolab.pbt_exploited_from" in run.data.tags  # PBT: copied another member
            starts.append(run.info.start_time / 1000)
            lr = client.get_metric_history(run_id, "pbt.trainer.lr")  # PBT: the lr each segment trained at
            if lr:
                schedules[t.number] = sorted((m.step, m.value) for m in lr)
    return {"trials": len(study.trials), "states": states, "params": params, "exploited": exploited,
            "lr_schedules": schedules, "histories": histories, "first_run": min(starts, default=None)}


# ------------------------------------------------------------------ output


def table(rows: list[dict], arms: list[str], random_epochs: float | None) -> str:
    lines = ["| arm | seeds | best val_acc (mean ± sd) | epochs trained | epochs to target | of random's epochs | wall s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine or all("refused" in r for r in mine):
            why = mine[0]["refused"] if mine else "not run"
            lines.append(f"| {arm} | 0 | missing: {why} | | | | |")
            continue
        mine = [r for r in mine if "refused" not in r]
        best, best_sd, n = mean_sd([r["best"] for r in mine])
        ep, ep_sd, _ = mean_sd([r["epochs"] for r in mine])
        tt, tt_sd, reached = mean_sd([r["epochs_to_target"] for r in mine])
        wall, wall_sd, _ = mean_sd([r["wall_s"] for r in mine])
        share = f"{tt / random_epochs:.2f}" if tt is not None and random_epochs else "-"
        tt_text = f"{tt:.0f} ± {tt_sd:.0f} ({reached}/{n} reached)" if tt is not None else f"never (0/{n})"
        lines.append(f"| {arm} | {n} | {100 * best:.2f} ± {100 * best_sd:.2f} | {ep:.0f} ± {ep_sd:.0f} | {tt_text} | "
                     f"{share} | {wall:.0f} ± {wall_sd:.0f} |")
    return "\n".join(lines)


def plot(rows: list[dict], arms: list[str], path: Path) -> None:
    """Per seed: best val_acc so far against epochs trained, one line per arm; dotted: the target (random's
    best - 0.5 points), dashed: a third of random's epochs (where ASHA should be at the target by)."""
    import matplotlib

    matplotlib.use("Agg")  # no display
    import matplotlib.pyplot as plt

    colors = {"random": "#718096", "hyperband": "#dd8a1a", "asha": "#2b6cb0", "pbt": "#2f855a"}
    seeds = sorted({r["seed"] for r in rows})
    fig, axes = plt.subplots(1, len(seeds), figsize=(3.6 * len(seeds), 3.6), dpi=110, sharey=True, squeeze=False)
    for ax, seed in zip(axes[0], seeds):
        for r in [r for r in rows if r["seed"] == seed and "refused" not in r]:
            curve = best_so_far(r["events"])
            ax.step(range(1, len(curve) + 1), [100 * v for v in curve], where="post", color=colors.get(r["arm"], "k"),
                    lw=1.5, label=r["arm"])
            if r["arm"] == "random":
                ax.axhline(100 * r["target"], color="k", ls=":", lw=0.8)
                ax.axvline(r["epochs"] / 3, color="k", ls="--", lw=0.6)
        ax.set_ylim(85, 100)
        ax.set_title(f"seed {seed}", fontsize=10)
        ax.set_xlabel("epochs trained, in the order received")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("best val_acc so far (%)")
    axes[0][-1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def write_outputs(args, rows: list[dict], arms: list[str], head: str) -> None:
    random_epochs = mean_sd([r.get("epochs") for r in rows if r["arm"] == "random"])[0]
    md = table(rows, arms, random_epochs)
    print(head + "\n\n" + md)
    for r in rows:  # kept small: [trial, epoch, value] in the order received (the plot's input)
        r["events"] = [[e[-3], e[-2], round(e[-1], 5)] for e in r.get("events", [])]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"header": head, "arms": arms, "rows": rows}))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(head + "\n\n" + md + "\n")
    if args.plot:
        plot(rows, arms, args.plot)


def run_lr_decay(args) -> int:
    """The lr-decay comparison: per seed the schedules grid, the fixed population and PBT, then the table."""
    task = TASKS["lr-decay"]
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        rows, head = saved["rows"], saved["header"]
    else:
        started, rows = time.time(), []
        workdir = Path(tempfile.mkdtemp(prefix="hpolab-bench-lr-decay-"))
        for seed in args.seeds:
            for arm in task["arms"]:
                r = run_arm(arm, seed, args.trials, workdir, task)
                if "refused" not in r:
                    r["trial_best"] = trial_best(r["histories"], task["maximize"])
                    r["best"] = summarise(epochs_of(r.pop("histories")), None, task["maximize"])["best"]
                    r.pop("store", None)
                print(f"seed {seed} {arm:>9}: {r.get('best', r.get('refused'))}, {r.get('wall_s')} s, "
                      f"{r.get('states')}, {r.get('exploited')} exploited  [{r.get('load_before')}]", flush=True)
                rows.append(r)
        shutil.rmtree(workdir, ignore_errors=True)
        head = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, task lr-decay ({task['spec']}, "
                f"{task['metric']}, lower is better), seeds {args.seeds}, population {args.trials} x {task['epochs']} "
                f"epochs, {time.time() - started:.0f} s in all; after: {load()}")
    summary = lr_decay_summary(rows, task["maximize"])
    md = lr_decay_table(summary)
    print(head + "\n\n" + md)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"header": head, "task": "lr-decay", "summary": summary, "rows": rows}))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(head + "\n\n" + md + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--trials", type=int, default=12, help="random search's configurations (and PBT's population)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--from-json", type=Path, help="train nothing: the table and plot of a --json written before")
    ap.add_argument("--compare-root", type=Path, help="another checkout (e.g. `mkdir /tmp/before; git archive COMMIT | tar -x -C /tmp/before`): "
                    "each seed's arms run with its hpolab and this one's, side by side, in alternating order; rows "
                    "are labelled '<arm> (before)' and '<arm> (after)'")
    ap.add_argument("--pbt-task", choices=["lr-decay"], help="PBT against fixed LR schedules on a task whose best LR "
                    "changes during training (studies/bench_lr_decay.yaml) instead of the four arms on digits")
    args = ap.parse_args()
    if args.pbt_task:
        return run_lr_decay(args)
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        write_outputs(args, saved["rows"], saved.get("arms", list(ARMS)), saved["header"])
        return 0
    arms = ["random", *[a for a in args.arms if a != "random"]]  # random first: it sets each seed's target

    started, rows = time.time(), []
    workdir = Path(tempfile.mkdtemp(prefix="hpolab-bench-mf-"))
    codes = [("before", args.compare_root.resolve()), ("after", ROOT)] if args.compare_root else [(None, ROOT)]
    for i, seed in enumerate(args.seeds):
        for code, root in codes if i % 2 == 0 else codes[::-1]:  # (alternating: neither side always runs first)
            rows += run_seed(seed, arms, args.trials, workdir, root, code)
    shutil.rmtree(workdir, ignore_errors=True)

    head = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, seeds {args.seeds}, {args.trials} random "
            f"configurations x {MAX_EPOCHS} epochs, {time.time() - started:.0f} s in all; after: {load()}")
    for r in rows:
        r.pop("store", None)
    labels = [f"{a} ({c})" if c else a for c, _ in codes for a in arms]
    write_outputs(args, rows, labels, head + wall_ratios(rows, [c for c, _ in codes]))
    return 0


def wall_ratios(rows: list[dict], codes: list[str | None]) -> str:
    """Each checkout's ASHA wall time (and CPU time) over random search's, per seed (the rows ran side by
    side); then each study's start, trials and end, and the least ASHA's wall ratio could be (free_segments_ratio)."""
    out = []
    for key, what in (("wall_s", "wall"), ("cpu_s", "driver CPU")):
        for tag in _tags(codes):
            out.append(_ratio_line(f"asha / random {what}{tag}", _per_seed(
                rows, tag, lambda random, asha: asha[key] / random[key] if random.get(key) and key in asha else None)))
    for tag in _tags(codes):
        parts = {arm: [r["phases"] for r in rows if r["arm"] == f"{arm}{tag}" and r.get("phases")] for arm in ("random", "asha")}
        if all(parts.values()):
            out.append(f"start | trials | end, mean s{tag}: " + "; ".join(
                f"{arm} " + " | ".join(f"{statistics.fmean(p[k] for p in got):.1f}" for k in ("start", "trials", "end"))
                for arm, got in parts.items()))
        out.append(_ratio_line(f"asha / random wall if ASHA's epochs cost what random's do and its segments nothing more{tag}",
                               _per_seed(rows, tag, free_segments_ratio)))
    return "".join(f"\n{line}" for line in out if line)


def _tags(codes: list[str | None]) -> list[str]:
    """The arm names' suffix of each checkout: ' (before)', ' (after)', or '' for this checkout alone."""
    return [f" ({code})" if code else "" for code in codes]


def _per_seed(rows: list[dict], tag: str, ratio) -> list[tuple[int, float]]:
    """[(seed, ratio(random's row, ASHA's row))] for each seed both arms ran (None ratios left out)."""
    random = {r["seed"]: r for r in rows if r["arm"] == f"random{tag}"}
    pairs = [(r["seed"], ratio(random[r["seed"]], r)) for r in rows if r["arm"] == f"asha{tag}" and r["seed"] in random]
    return [(seed, x) for seed, x in pairs if x is not None]


def _ratio_line(label: str, pairs: list[tuple[int, float]]) -> str:
    if not pairs:
        return ""
    return f"{label}: {statistics.fmean(x for _, x in pairs):.2f}x (" + ", ".join(f"seed {s} {x:.2f}x" for s, x in pairs) + ")"


def run_seed(seed: int, arms: list[str], trials: int, workdir: Path, root: Path, code: str | None) -> list[dict]:
    """One seed's arms with checkout `root`'s hpolab; random first (it sets the seed's target)."""
    rows, target = [], None
    for arm in arms:
        r = run_arm(arm, seed, trials, workdir, root=root, code=code)
        if code:
            r["arm"], r["code"] = f"{arm} ({code})", code
        if "refused" not in r:
            r["events"] = epochs_of(r.pop("histories"))
            if arm == "random":
                target = summarise(r["events"], None)["best"] - TARGET_POINTS / 100
            r.update(summarise(r["events"], target), target=target)
            r["phases"] = phases(r.pop("started"), r["wall_s"], r.pop("first_run"), r["events"])
            print(f"seed {seed} {r['arm']:>9}: best {r['best']:.4f}, {r['epochs']} epochs, to target {r['epochs_to_target']}, "
                  f"{r['wall_s']} s ({r['cpu_s']} s driver CPU), {r['states']}, {r['exploited']} exploited  [{r['load_before']}]", flush=True)
        else:
            print(f"seed {seed} {arm:>9}: refused: {r['refused']}", flush=True)
        rows.append(r)
    return rows


if __name__ == "__main__":
    sys.exit(main())
