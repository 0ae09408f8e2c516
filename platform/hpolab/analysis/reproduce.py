"""`hpolab reproduce RUN_ID`: train a trial again from what its MLflow run recorded, and compare.

The run's `config.yaml` artifact is the complete resolved config (seed included), `env.*` tags
say what it ran on and `hpolab.torch_threads` how many CPU threads it used (the order of float
reductions depends on it; replayed up to the CPUs available now, said when fewer). The retrained
per-epoch metrics are compared with the run's history:
same seed + same environment (+ `trainer.deterministic` on a GPU) => identical numbers. Nothing is
written to the stores. Exit 0 when every compared value matches within --tolerance, 1 otherwise.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

COMPARED = ("train_loss", "val_loss")  # + the run's study metric (val_acc, val_rmse, val_map, ...)
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


def _history(client, run_id: str, config: dict) -> tuple[tuple[str, ...], dict[str, dict[int, float]], int]:
    """The compared metrics, the run's history of each by epoch, and how many epochs it logged."""
    from hpolab.errors import UserError

    compared = tuple(dict.fromkeys((*COMPARED, config["metric"])))
    history = {m: {h.step: h.value for h in client.get_metric_history(run_id, m)} for m in compared}
    epochs = max(history["val_loss"], default=0)
    if epochs == 0:
        raise UserError(f"run {run_id} logged no epochs: nothing to compare")
    return compared, history, epochs


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


def _retrain(config: dict, tags: dict[str, str], exp, epochs: int, console, schedule=None):
    """fit() again with the run's config, seed and thread count, for the run's number of epochs. A PBT
    member's `schedule` is replayed (reproduce_pbt.py): one fit per stretch of the same values, each
    resuming from the previous one's checkpoint with the next values, as the member's segments did."""
    import torch

    from hpolab.analysis.reproduce_pbt import apply, segments

    trainer = {**config["trainer"], "inject_nan_at_step": None, "inject_oom_at_step": None}
    if tags.get("hpolab.trainer_overrides"):
        console.print(f"  [yellow]note[/]: this attempt ran with {tags['hpolab.trainer_overrides']} (after a CUDA OOM); "
                      "epochs it carried over from an earlier attempt were trained without it")
    torch.set_num_threads(_threads(int(tags.get("hpolab.torch_threads", "1")), console))
    result = None
    with tempfile.TemporaryDirectory() as ckpt:
        for first, last, values in segments(schedule or [], epochs):
            apply(config, trainer, values, first, console)
            resume_from = Path(ckpt) / "last.pt" if result is not None else None
            result = _fit_segment(config, trainer, exp, ckpt, resume_from, last)
    return result


def _fit_segment(config: dict, trainer: dict, exp, ckpt: str, resume_from, last: int):
    """One trial process's fit(): seeded, data and model built, as the trial process does; stops after epoch `last`."""
    from hpolab.train import fit, seed_everything
    from hpolab.train.config import trainer_config
    from hpolab.train.data import data_seed_of
    from hpolab.train.tasks import task_for

    seed_everything(config["seed"], bool(trainer.get("deterministic", False)))  # as the trial process did
    data = exp.load_data(config["data"], data_seed_of(config))
    model = exp.build_model(config["model"], data.input_shape, data.num_classes)
    return fit(trainer_config(trainer), model, data, metric=config["metric"], direction=config["direction"],
               seed=config["seed"], checkpoint_dir=ckpt, task=task_for(exp), resume_from=resume_from,
               on_epoch=lambda epoch, _metrics: epoch >= last)


def _pbt_schedule(stores, tags: dict[str, str], compared: tuple[str, ...], history: dict, console):
    """A PBT member's schedule (None for other runs); its history after the first exploit is left out
    of the comparison, its `lr` added (reproduce_pbt.py says why)."""
    from hpolab.analysis.reproduce_pbt import describe, first_exploit, member_schedule

    schedule = member_schedule(stores, tags)
    if not schedule:
        return None
    console.print(f"  PBT member: replaying its schedule from scratch ({describe(schedule)})")
    exploit = first_exploit(tags)
    if exploit is not None:
        console.print(f"  it exploited {tags.get('hpolab.pbt_parents')} (member@epoch): those weights are not copied, so after "
                      f"epoch {exploit} the replay trains its own and only lr is compared")
        for m in compared:
            history[m] = {e: v for e, v in history[m].items() if e <= exploit}
    return schedule


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


def _compare_table(title: str, compared: tuple[str, ...], history: dict[str, dict[int, float]], result):
    """The side-by-side table (original vs reproduced per epoch) and the largest absolute difference."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("epoch", justify="right")
    for m in compared:
        table.add_column(f"{m} original", justify="right")
        table.add_column("reproduced", justify="right")
    worst = 0.0
    for h in result.history:
        e = int(h["epoch"])
        row = [str(e)]
        for m in compared:
            orig = history[m].get(e)
            new = h.get(m)
            if orig is not None and new is not None:
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
    from hpolab.config.experiment import is_own_loop

    if is_own_loop(exp):  # its train(config, trial) again (reproduce_own_loop.py)
        from hpolab.analysis.reproduce_own_loop import reproduce_own_loop

        threads = _threads(int(tags.get("hpolab.torch_threads", "1")), console)
        compared, history, result = reproduce_own_loop(client, stores, run, config, exp, console, threads)
    else:
        compared, history, epochs = _history(client, args.run_id, config)
        schedule = _pbt_schedule(stores, tags, compared, history, console)
        if schedule:  # the LR the optimizer used: the schedule replayed
            compared, history["lr"] = (*compared, "lr"), {h.step: h.value for h in client.get_metric_history(args.run_id, "lr")}
        result = _retrain(config, tags, exp, epochs, console, schedule)

    table, worst = _compare_table(f"{run.info.run_name}: original vs reproduced", compared, history, result)
    console.print(table)
    ok = worst <= args.tolerance
    verdict = "identical" if worst == 0 else f"max abs difference {worst:.3g}"
    console.print(f"{'[green]reproduced[/]' if ok else '[red]NOT reproduced[/]'}: {verdict} (tolerance {args.tolerance:g})"
                  + ("" if ok or not differs else "; the environment differs (above), which alone can explain it"))
    return 0 if ok else 1
