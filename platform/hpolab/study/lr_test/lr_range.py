"""The study's LR range test, outside the sweep: run it on the spec's experiment, plot, CSV, MLflow.

The sweep itself is `hpolab.train.lr_range_test` (pure torch); this module is the outside of it,
shared by the driver (which runs it once before trial 0) and `hpolab lr-find` (tools/lr_find.py):

- `run_lr_find(spec, stores, out_dir)`: fresh data + model from the spec's experiment, the sweep with
  `spec.lr_range_test` settings and `spec.trainer`, then the plot and CSV written into out_dir.
- `run_in_process(conn, job)`: the same in a child process (the driver forks it before the first
  trial, like a trial process); sends back ("done", plain data) or ("fail", {"reason", "traceback"}).
  No MLflow/Optuna in the child: the driver is the only writer to both stores and calls
  `log_to_mlflow` with what comes back.
- `log_to_mlflow(...)`: its own run named `lr-range-test` in the study's experiment, nested under
  the study's parent run when there is one; the curve as metric series (step = sweep step), the
  suggestions as params, plot and CSV as artifacts.

Plots use matplotlib's object-oriented API on an Agg canvas (`Figure` + `FigureCanvasAgg`), never
pyplot: no global backend switch, no global figure registry, safe in threads and in the driver.
"""

from __future__ import annotations

import csv
import math
import os
import signal
import sys
import textwrap
import time
import traceback
from pathlib import Path
from typing import Any

from hpolab.study.trials.lifeline import watch_lifeline
from hpolab.train.lr_range_test import LRRangeResult, bounds_from_lr_range_test, lr_range_test, rule_suggestions

RUN_NAME = "lr-range-test"
PLOT_NAME = "lr_range_test.png"
CSV_NAME = "lr_range_test.csv"
ARTIFACT_DIR = "lr_range_test"  # folder of the run's artifacts
CSV_COLUMNS = ("step", "lr", "loss", "smoothed_loss")
METRIC_BATCH = 1000  # MLflow's log_batch limit for metrics


# ---------------------------------------------------------------- outputs


def _fmt(v: float | None) -> str:
    return "none" if v is None else f"{v:.3g}"


def bounds_or_none(result: LRRangeResult) -> tuple[float, float] | None:
    """Search-space bounds by the documented rule, or None when the test gave no suggestion."""
    if result.suggestion is None:
        return None
    return bounds_from_lr_range_test(result)


def study_user_attr(result: LRRangeResult, run_id: str | None = None) -> dict[str, Any] | None:
    """What the driver stores as the Optuna study user attr `lr_range_test` ({"low", "high", ...}).

    None when there is no suggestion: a `from_lr_range_test` search space then cannot be built and
    the driver should stop with `result.warning`.
    """
    bounds = bounds_or_none(result)
    if bounds is None:
        return None
    return {
        "low": bounds[0],
        "high": bounds[1],
        "suggestion": result.suggestion,
        "rule": result.suggestion_rule,
        "diverged_at_lr": result.diverged_at_lr,
        "mlflow_run_id": run_id,
    }


def write_csv(result: LRRangeResult, path: str | Path) -> Path:
    """One row per recorded sweep step: step, lr, loss, smoothed_loss (full float precision)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for step, (lr, loss, sm) in enumerate(zip(result.lrs, result.losses, result.smoothed)):
            w.writerow([step, repr(float(lr)), repr(float(loss)), repr(float(sm))])
    return path


def summary_text(result: LRRangeResult) -> str:
    """A few human-readable lines: what ran, why it stopped, the suggestion, divergence, bounds, warning."""
    s = result.settings
    lines = []
    if s:
        lines.append(
            f"LR range test: {len(result.lrs)}/{s.get('num_steps')} steps, lr {s.get('min_lr'):.3g} -> "
            f"{s.get('max_lr'):.3g} ({s.get('mode')}), {s.get('optimizer')}, effective batch "
            f"{s.get('effective_batch')} ({s.get('batch_size')} x {s.get('grad_accum_steps')}), "
            f"amp {s.get('amp')}, {s.get('device')}, {result.seconds:.1f}s"
        )
    else:
        lines.append(f"LR range test: {len(result.lrs)} steps")
    lines.append(f"stopped: {result.reason}")
    if result.suggestion is not None:
        lines.append(f"suggested lr: {result.suggestion:.3g}  ({result.suggestion_rule} rule)")
    else:
        lines.append("suggested lr: none")
    min_div_10 = _fmt(result.min_loss_lr / 10) if result.min_loss_lr is not None else "none"
    lines.append(
        f"  steepest descent {_fmt(result.steepest_lr)} | valley {_fmt(result.valley_lr)} | "
        f"min loss at {_fmt(result.min_loss_lr)} (min/10 = {min_div_10})"
    )
    lines.append(
        f"divergence: at lr {result.diverged_at_lr:.3g}" if result.diverged_at_lr is not None else "divergence: none within the sweep"
    )
    bounds = bounds_or_none(result)
    if bounds is not None:
        lines.append(f"search bounds for from_lr_range_test: low {bounds[0]:.3g}, high {bounds[1]:.3g}")
    if result.warning:
        lines.append(f"warning: {result.warning}")
    return "\n".join(lines)


def _mark_points(ax, result: LRRangeResult) -> None:
    """Search bounds, suggestion, steepest and minimum points, and divergence, on the smoothed curve."""
    lrs, smoothed = result.lrs, result.smoothed

    def at(lr: float) -> float:
        i = min(range(len(lrs)), key=lambda k: abs(math.log(lrs[k]) - math.log(lr)))
        return smoothed[i]

    bounds = bounds_or_none(result)
    if bounds is not None:
        ax.axvspan(bounds[0], bounds[1], color="tab:green", alpha=0.08, label=f"search bounds {bounds[0]:.1e}..{bounds[1]:.1e}")
    if result.suggestion is not None:
        ax.axvline(result.suggestion, color="tab:green", ls="--", lw=1.5)
        ax.plot([result.suggestion], [at(result.suggestion)], "o", color="tab:green", ms=9,
                label=f"suggestion {result.suggestion:.2e} ({result.suggestion_rule})")
    if result.steepest_lr is not None:
        ax.plot([result.steepest_lr], [at(result.steepest_lr)], "v", color="tab:orange", ms=8,
                label=f"steepest descent {result.steepest_lr:.2e}")
    if result.min_loss_lr is not None:
        ax.plot([result.min_loss_lr], [at(result.min_loss_lr)], "s", color="tab:gray", ms=7,
                label=f"min smoothed loss {result.min_loss_lr:.2e}")
    if result.diverged_at_lr is not None:
        ax.axvline(result.diverged_at_lr, color="tab:red", ls=":", lw=2, label=f"diverged at {result.diverged_at_lr:.2e}")


def plot_lr_range_test(result: LRRangeResult, path: str | Path, title: str | None = None) -> Path:
    """Loss vs LR (log x axis): raw and smoothed loss, suggestion, steepest/min points, divergence, bounds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(9, 5.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)  # attaches an Agg canvas to this figure only
    ax = fig.add_subplot()
    lrs, losses, smoothed = result.lrs, result.losses, result.smoothed
    s = result.settings

    heading = "LR range test" + (f": {title}" if title else "")
    if result.suggestion is not None:
        heading += f"  -  suggested lr {result.suggestion:.2e} ({result.suggestion_rule})"
    else:
        heading += "  -  no suggestion"
    fig.suptitle(heading, fontsize=12)
    if s:
        ax.set_title(
            f"{s.get('optimizer')}, effective batch {s.get('effective_batch')}, {len(lrs)}/{s.get('num_steps')} steps "
            f"({s.get('mode')}), EMA smoothing {s.get('smoothing')}, amp {s.get('amp')}",
            fontsize=9,
        )

    if lrs:
        ax.plot(lrs, losses, color="tab:blue", alpha=0.35, lw=1, label="loss per step")
        ax.plot(lrs, smoothed, color="tab:blue", lw=2, label="smoothed loss (EMA)")
        _mark_points(ax, result)

        # y range: the descent is what matters; a divergence spike would flatten it into a line.
        i_min = min(range(len(smoothed)), key=smoothed.__getitem__)
        start_level = max(smoothed[: i_min + 1] + losses[: min(3, len(losses))])
        lo = min(losses + smoothed)
        hi = min(max(losses + smoothed), start_level * 1.5)
        if hi > lo:
            pad = 0.05 * (hi - lo)
            ax.set_ylim(max(lo - pad, 0.0) if lo >= 0 else lo - pad, hi + pad)
        ax.set_xscale("log")
        ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
    else:
        ax.text(0.5, 0.5, "no finite loss recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("learning rate (log scale)")
    ax.set_ylabel("training loss")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.1)
    if result.warning:
        ax.text(0.99, 0.02, textwrap.fill("warning: " + result.warning, 90), transform=ax.transAxes,
                ha="right", va="bottom", fontsize=7, color="darkred",
                bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "darkred"})
    fig.savefig(path)
    return path


def write_outputs(result: LRRangeResult, out_dir: str | Path, title: str | None = None) -> dict[str, Path]:
    out_dir = Path(out_dir)
    return {
        "plot": plot_lr_range_test(result, out_dir / PLOT_NAME, title=title),
        "csv": write_csv(result, out_dir / CSV_NAME),
    }


# ---------------------------------------------------------------- MLflow


def _run_params(result: LRRangeResult) -> dict[str, Any]:
    """The test's run params: suggestions, bounds, every rule's LR, and the sweep settings."""
    bounds = bounds_or_none(result)
    return {
        "suggestion": result.suggestion,
        "suggestion_rule": result.suggestion_rule,
        "steepest_lr": result.steepest_lr,
        "valley_lr": result.valley_lr,
        "min_loss_lr": result.min_loss_lr,
        "diverged_at_lr": result.diverged_at_lr,
        "search_low": bounds[0] if bounds else None,
        "search_high": bounds[1] if bounds else None,
        **{f"rule.{k}": v for k, v in rule_suggestions(result).items()},  # every rule, for comparison
        "steps_run": len(result.lrs),
        "stopped_early": result.stopped_early,
        **{f"lr_test.{k}": v for k, v in result.settings.items()},
    }


def log_to_mlflow(
    client,
    experiment_id: str,
    parent_run_id: str | None,
    result: LRRangeResult,
    out_dir: str | Path,
    params: dict[str, Any] | None = None,
) -> str:
    """Log the test as its own finished run `lr-range-test`; returns its run id.

    Nested under `parent_run_id` (tag mlflow.parentRunId) when given. Metrics lr_test_loss,
    lr_test_smoothed_loss, lr_test_lr with step = sweep step; the suggestions, bounds and sweep
    settings as params (plus `params`, e.g. the study's); plot and CSV from out_dir (written there
    first when missing) under the artifact folder `lr_range_test/`.
    """
    from mlflow.entities import Metric
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

    from hpolab.stores import mlflow_runs as tr

    out_dir = Path(out_dir)
    plot_path, csv_path = out_dir / PLOT_NAME, out_dir / CSV_NAME
    if not plot_path.is_file():
        plot_lr_range_test(result, plot_path)
    if not csv_path.is_file():
        write_csv(result, csv_path)

    tags = {MLFLOW_RUN_NAME: RUN_NAME, "hpolab.role": "lr_range_test", "hpolab.lr_test.reason": result.reason,
            "mlflow.note.content": summary_text(result)}
    if parent_run_id:
        tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
    if result.warning:
        tags["hpolab.lr_test.warning"] = result.warning
    run = client.create_run(experiment_id, run_name=RUN_NAME, tags=tags)
    run_id = run.info.run_id
    try:
        merged = {**(params or {}), **_run_params(result)}  # what actually ran wins over the caller's extras
        tr.log_params(client, run_id, {k: str(v)[: tr.MAX_PARAM_LEN] for k, v in merged.items()})

        ts = int(time.time() * 1000)
        metrics = []
        for step, (lr, loss, sm) in enumerate(zip(result.lrs, result.losses, result.smoothed)):
            metrics += [
                Metric("lr_test_loss", float(loss), ts, step),
                Metric("lr_test_smoothed_loss", float(sm), ts, step),
                Metric("lr_test_lr", float(lr), ts, step),
            ]
        for i in range(0, len(metrics), METRIC_BATCH):
            client.log_batch(run_id, metrics=metrics[i : i + METRIC_BATCH])
        client.log_artifact(run_id, str(plot_path), ARTIFACT_DIR)
        client.log_artifact(run_id, str(csv_path), ARTIFACT_DIR)
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
    return run_id


# ---------------------------------------------------------------- running it


def default_out_dir(stores, spec) -> Path:
    """<store>/lr-find/<study>: next to the trial checkpoints."""
    return Path(stores.root) / "lr-find" / spec.name


def run_lr_find(spec, stores=None, out_dir: str | Path | None = None, threads: int | None = None) -> tuple[LRRangeResult, dict[str, Path]]:
    """Run the range test for a StudySpec in this process; write plot and CSV into out_dir.

    Data from `exp.load_data(resolved["data"], spec.seed)`, a fresh `exp.build_model(...)` (the
    test trains a copy of it anyway), the trainer as configured in `spec.trainer`, the sweep as in
    `spec.lr_range_test` (whether or not `enabled`: asking for it is enabling it). out_dir defaults
    to `default_out_dir(stores, spec)`. `threads` sets torch's intra-op threads for this process.
    Returns (result, {"plot": path, "csv": path}). Nothing is logged anywhere.
    """
    import torch

    from hpolab.config.training_loop import require_builtin_loop
    from hpolab.config.spec import load_experiment
    from hpolab.train.data import data_seed_of
    from hpolab.train.seeding import seed_everything
    from hpolab.train.tasks import task_for

    if out_dir is None:
        if stores is None:
            raise ValueError("run_lr_find needs out_dir, or stores to put the outputs under <store>/lr-find/<study>")
        out_dir = default_out_dir(stores, spec)
    if threads is not None:
        torch.set_num_threads(max(1, int(threads)))
    exp = load_experiment(spec.experiment)
    require_builtin_loop(exp, "lr-find")
    resolved = spec.resolved_config(exp)
    data = exp.load_data(resolved["data"], data_seed_of(resolved))
    # Seeded before the model is built: its initial weights (and so the curve) follow from the spec.
    seed_everything(spec.seed, deterministic=spec.trainer.deterministic)
    model = exp.build_model(resolved["model"], data.input_shape, data.num_classes)
    t = spec.lr_range_test
    result = lr_range_test(
        spec.trainer,
        model,
        data,
        min_lr=t.min_lr,
        max_lr=t.max_lr,
        num_steps=t.num_steps,
        mode=t.mode,
        smoothing=t.smoothing,
        diverge_factor=t.diverge_factor,
        seed=spec.seed,
        task=task_for(exp),  # the sweep minimizes the experiment's task loss
    )
    paths = write_outputs(result, out_dir, title=spec.name)
    return result, paths


# ---------------------------------------------------------------- child process


def make_job(spec, out_dir: str | Path, *, project_dir: str | Path | None = None, threads: int | None = None,
             cuda_device: str | None = None) -> dict[str, Any]:
    """The plain-data job for `run_in_process` (picklable; the spec travels as its JSON dump)."""
    return {
        "spec": spec.model_dump(mode="json"),
        "out_dir": str(out_dir),
        "project_dir": str(Path(project_dir or Path.cwd()).resolve()),
        "threads": threads,
        "cuda_device": cuda_device,
    }


def run_in_process(conn, job: dict[str, Any], lifeline=None) -> None:
    """Child-process entry (target of a forked/forkserver Process), in the style of trial_process.run.

    Sends exactly one message: ("done", {"result": LRRangeResult.to_dict(), "paths": {"plot", "csv"},
    "summary": str, "bounds": {"low", "high"} | None}) or ("fail", {"reason", "traceback"}).
    `lifeline`: optional pipe end whose EOF (the driver died) ends this process.
    """
    # Ctrl-C and SIGTERM (to the whole process group: a terminal, `docker stop`, a scheduler) are the
    # driver's to handle, as in a trial process: it lets the test finish, or kills it on the second.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if lifeline is not None:
        watch_lifeline(lifeline)
    try:
        if job.get("cuda_device") is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(job["cuda_device"])  # before CUDA initializes
        project_dir = job.get("project_dir")
        if project_dir and project_dir not in sys.path:
            sys.path.insert(0, project_dir)
        from hpolab.config.spec import StudySpec

        spec = StudySpec.model_validate(job["spec"])
        result, paths = run_lr_find(spec, None, Path(job["out_dir"]), threads=job.get("threads"))
        bounds = bounds_or_none(result)
        conn.send(
            (
                "done",
                {
                    "result": result.to_dict(),
                    "paths": {k: str(v) for k, v in paths.items()},
                    "summary": summary_text(result),
                    "bounds": {"low": bounds[0], "high": bounds[1]} if bounds else None,
                },
            )
        )
    except Exception as e:
        conn.send(("fail", {"reason": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}))
    finally:
        conn.close()
