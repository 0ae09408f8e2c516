"""`hpolab reproduce RUN_ID`: train a trial again from what its MLflow run recorded, and compare.

The run's `config.yaml` artifact is the complete resolved config (seed included), `env.*` tags
say what it ran on and `hpolab.torch_threads` how many CPU threads it used (the order of float
reductions depends on it; replayed up to the CPUs available now, said when fewer). Every experiment
is trained again the same way: its `train(config, trial)` (an own loop's, or the built-in routine's:
train/builtin.py) in this process, with the trial process's own trial object, seeded as the trial
process seeded it (run_trial), and a Replay (replay_trial.py) as its driver: it records the reports
and stops the loop after the epochs the run logged. Every metric
it reports that the run has is compared with the run's history per epoch (timing excepted):
same seed + same environment (+ `trainer.deterministic` on a GPU) => identical numbers. A PBT
member's schedule is replayed stretch by stretch (reproduce_pbt.py). Nothing is written to the
stores. Exit 0 when every compared value matches within --tolerance, 1 otherwise.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

ENV_KEYS = ("env.python", "env.torch", "env.cuda", "env.cudnn", "env.gpu", "env.numpy", "env.git_commit", "env.git_dirty")


def _load_run(client, run_id: str, stores) -> tuple:
    """The run, its resolved config (config.yaml artifact) and its experiment's name; UserError when missing."""
    import yaml
    from mlflow.exceptions import MlflowException

    from hpolab.errors import UserError

    try:
        run = client.get_run(run_id)
    except MlflowException as e:
        raise UserError(f"no run {run_id} in {stores.tracking_shown} ({e.message}); is --store/--tracking-uri right?") from None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, "config.yaml", tmp)
        except Exception:
            raise UserError(f"run {run_id} has no config.yaml artifact: only trial runs of a study can be reproduced") from None
        config = yaml.safe_load(Path(path).read_text())
    experiment = run.data.tags.get("hpolab.experiment")
    if not experiment:
        raise UserError(f"run {run_id} does not say which experiment it ran (tag hpolab.experiment)")
    return run, config, experiment


def _environment_differs(tags: dict[str, str]) -> list[tuple[str, str, str]]:
    """(key, was, is now) for each ENV_KEYS entry, and each package of the experiment the run recorded
    (env.<distribution>: stores/experiment_packages.py), that differs from this machine."""
    from importlib import metadata

    from hpolab.stores.environment import capture_environment

    now = capture_environment()
    for key in tags:
        if key.startswith("env.") and key not in now:
            try:
                now[key] = metadata.version(key.removeprefix("env."))
            except (metadata.PackageNotFoundError, ValueError):
                continue
    keys = [*ENV_KEYS, *sorted(k for k in tags if k.startswith("env.") and k in now and k not in ENV_KEYS and k not in _MACHINE)]
    return [(k, tags.get(k, "?"), now.get(k, "?")) for k in keys if tags.get(k, "?") != now.get(k, "?")]


# env.* tags that describe the machine or the launch, not a version a reproduction must match
_MACHINE = ("env.platform", "env.hostname", "env.executable", "env.cuda_available", "env.gpu_driver", "env.optuna",
            "env.mlflow", "env.hpolab", "env.torchvision")


def _epochs(client, run_id: str, config: dict) -> int:
    """How many epochs the run logged (of its study metric); UserError when none."""
    from hpolab.errors import UserError

    epochs = max((h.step for h in client.get_metric_history(run_id, config["metric"])), default=0)
    if epochs == 0:
        raise UserError(f"run {run_id} logged no epoch of {config['metric']}: nothing to compare")
    return epochs


def _experiment(client, run, experiment: str, allow_change: bool, console):
    """The module to retrain with: the importable one (refused when its code differs from what the run
    ran, unless --allow-code-change), else the code the run recorded."""
    from hpolab.config.experiment_code import mismatch
    from hpolab.errors import UserError
    from hpolab.stores.code_artifacts import experiment_for_runs

    found = experiment_for_runs(client, [run], experiment)
    if found.here is None:
        console.print(f"  experiment {experiment}: not importable here; using the code the run recorded (hash {found.recorded_hash})")
    elif found.differs:
        text = mismatch(experiment, found.here, found.recorded_hash, f"run {run.info.run_id}")
        if not allow_change:
            raise UserError(f"{text}: the retrained numbers would not test the same code. Sync the module with the run's "
                            "(its artifact code/ holds it), or pass --allow-code-change to retrain with the code here")
        console.print(f"  [yellow]code differs[/] (--allow-code-change): {text}")
    return found.module


def _retrain(run, stores, config: dict, exp, epochs: int, console, schedule=None):
    """The experiment's train(config, trial) again with the run's config, seed and thread count, for the
    run's number of epochs: the Replay with its reports. A PBT member's `schedule` is replayed one
    stretch of the same values after the other, each resuming from the previous one's checkpoint with
    the next values, as the member's segments did."""
    import torch

    from hpolab.analysis.replay_trial import Replay, sampled_params
    from hpolab.analysis.reproduce_pbt import apply, segments
    from hpolab.config.experiment import train_of

    tags = run.data.tags
    if tags.get("hpolab.trainer_overrides"):
        console.print(f"  [yellow]note[/]: this attempt ran with {tags['hpolab.trainer_overrides']} (after a CUDA OOM); "
                      "epochs it carried over from an earlier attempt were trained without it")
    train = train_of(exp)
    if tags.get("hpolab.resumed_after_epoch") and not getattr(train, "resumes_exactly", False):  # (the routine's do)
        console.print(f"  [yellow]note[/]: this attempt resumed after epoch {tags['hpolab.resumed_after_epoch']}; the "
                      "reproduction trains from scratch (random streams after the resume differ, so may the numbers)")
    torch.set_num_threads(_threads(int(tags.get("hpolab.torch_threads", "1")), console))
    config = {**config, "trainer": {**config["trainer"], "inject_nan_at_step": None, "inject_oom_at_step": None}}
    with tempfile.TemporaryDirectory(prefix="hpolab-reproduce-") as folder:
        replay = Replay(exp, int(tags.get("optuna.trial_number", "0")), sampled_params(run, stores), Path(folder))
        for first, last, values in segments(schedule or [], epochs):
            config = {**config, "trainer": dict(config["trainer"]), **{k: dict(config[k]) for k in ("model", "data") if k in config}}
            apply(config, config["trainer"], values, first, console)
            replay.stretch(config, last)
    return replay


def _compared(client, run, replay, exploit: int | None) -> tuple[tuple[str, ...], dict[str, dict[int, float]]]:
    """The metrics the replay reported that the run has (timing excepted), and the run's history of
    each; after a PBT member's first `exploit` only its lr (reproduce_pbt.py says why)."""
    from hpolab.analysis.replay_trial import TIMING

    reported = dict.fromkeys(k for row in replay.history for k in row if k != "epoch" and k not in TIMING)
    compared = tuple(m for m in reported if m in run.data.metrics)
    history = {m: {h.step: h.value for h in client.get_metric_history(run.info.run_id, m)} for m in compared}
    if exploit is not None:
        history = {m: (h if m == "lr" else {e: v for e, v in h.items() if e <= exploit}) for m, h in history.items()}
    return compared, history


def _pbt_schedule(stores, tags: dict[str, str], console):
    """A PBT member's (schedule, first exploit epoch); (None, None) for other runs."""
    from hpolab.analysis.reproduce_pbt import describe, first_exploit, member_schedule

    schedule = member_schedule(stores, tags)
    if not schedule:
        return None, None
    console.print(f"  PBT member: replaying its schedule from scratch ({describe(schedule)})")
    exploit = first_exploit(tags)
    if exploit is not None:
        console.print(f"  it exploited {tags.get('hpolab.pbt_parents')} (member@epoch): those weights are not copied, so after "
                      f"epoch {exploit} the replay trains its own and only lr is compared")
    return schedule, exploit


def _threads(recorded: int, console) -> int:
    """The run's thread count, but no more than the CPUs this process may use now (affinity mask,
    cgroup quota): more threads than CPUs only contend. Said, since a different count can change
    the float reduction order and so the last digits."""
    from hpolab.train.cpus import available_cpus

    cpus = available_cpus()
    if recorded <= cpus:
        return recorded
    console.print(f"  [yellow]note[/]: the run ran with {recorded} CPU threads; {cpus} CPU{'s are' if cpus != 1 else ' is'} "
                  f"available here: reproducing with {cpus} thread{'s' if cpus != 1 else ''} (the last digits may differ)")
    return cpus


def _compare_table(title: str, compared: tuple[str, ...], history: dict[str, dict[int, float]], reported: list[dict]):
    """The side-by-side table (original vs reproduced per epoch) and the largest absolute difference."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("epoch", justify="right")
    for m in compared:
        table.add_column(f"{m} original", justify="right")
        table.add_column("reproduced", justify="right")
    worst = 0.0
    for h in reported:
        e = int(h["epoch"])
        row = [str(e)]
        for m in compared:
            orig = history[m].get(e)
            new = h.get(m)
            if orig is not None and new is not None and not (orig == new or math.isnan(orig) and math.isnan(new)):
                worst = max(worst, abs(orig - new) if math.isfinite(orig) and math.isfinite(new) else math.inf)
            row += [f"{orig:.6g}" if orig is not None else "-", f"{new:.6g}" if new is not None else "-"]
        table.add_row(*row)
    return table, worst


def reproduce_cmd(args, stores) -> int:
    from rich.console import Console

    from hpolab.stores import mlflow_runs as tr

    console = Console(highlight=False)
    client = tr.client_for(stores)
    run, config, experiment = _load_run(client, args.run_id, stores)
    tags = run.data.tags

    differs = _environment_differs(tags)
    console.print(f"[bold]reproducing run {args.run_id}[/] ({run.info.run_name}, experiment {experiment})")
    for k, was, is_ in differs:
        console.print(f"  [yellow]environment differs[/]: {k.removeprefix('env.')} was {was}, now {is_}")

    # Same epochs as the original: a pruned or early-stopped trial ran fewer than max_epochs. It keeps
    # its configured max_epochs (the LR schedule is a function of it) and stops after those epochs.
    exp = _experiment(client, run, experiment, bool(getattr(args, "allow_code_change", False)), console)
    epochs = _epochs(client, args.run_id, config)
    schedule, exploit = _pbt_schedule(stores, tags, console)
    replay = _retrain(run, stores, config, exp, epochs, console, schedule)
    compared, history = _compared(client, run, replay, exploit)

    table, worst = _compare_table(f"{run.info.run_name}: original vs reproduced", compared, history, replay.history)
    console.print(table)
    ok = worst <= args.tolerance
    verdict = "identical" if worst == 0 else f"max abs difference {worst:.3g}"
    console.print(f"{'[green]reproduced[/]' if ok else '[red]NOT reproduced[/]'}: {verdict} (tolerance {args.tolerance:g})"
                  + ("" if ok or not differs else "; the environment differs (above), which alone can explain it"))
    return 0 if ok else 1
