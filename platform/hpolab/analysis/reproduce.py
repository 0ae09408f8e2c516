"""`hpolab reproduce RUN_ID`: train a trial again from what its MLflow run recorded, and compare.

The run's `config.yaml` artifact is the complete resolved config (seed included), `env.*` tags
say what it ran on and `hpolab.torch_threads` how many CPU threads it used (the order of float
reductions depends on it). The retrained per-epoch metrics are compared with the run's history:
same seed + same environment (+ `trainer.deterministic` on a GPU) => identical numbers. Nothing is
written to the stores. Exit 0 when every compared value matches within --tolerance, 1 otherwise.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

COMPARED = ("train_loss", "val_loss")  # + the run's study metric (val_acc, val_rmse, val_map, ...)
ENV_KEYS = ("env.python", "env.torch", "env.cuda", "env.cudnn", "env.gpu", "env.numpy", "env.git_commit", "env.git_dirty")


def reproduce_cmd(args, stores) -> int:
    import torch
    import yaml
    from mlflow.exceptions import MlflowException
    from rich.console import Console
    from rich.table import Table

    from hpolab.errors import UserError
    from hpolab.config.experiment import load_experiment
    from hpolab.train.config import trainer_config
    from hpolab.train.tasks import task_for
    from hpolab.stores import mlflow_runs as tr
    from hpolab.stores.paths import redact
    from hpolab.stores.environment import capture_environment
    from hpolab.train import fit, seed_everything

    console = Console(highlight=False)
    client = tr.client_for(stores)
    try:
        run = client.get_run(args.run_id)
    except MlflowException as e:
        raise UserError(f"no run {args.run_id} in {redact(stores.tracking_uri)} ({e.message}); is --store/--tracking-uri right?") from None
    tags = run.data.tags
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(args.run_id, "config.yaml", tmp)
        except Exception:
            raise UserError(f"run {args.run_id} has no config.yaml artifact: only trial runs of a study can be reproduced") from None
        config = yaml.safe_load(Path(path).read_text())
    experiment = tags.get("hpolab.experiment")
    if not experiment:
        raise UserError(f"run {args.run_id} does not say which experiment it ran (tag hpolab.experiment)")

    now = capture_environment()
    differs = [(k, tags.get(k, "?"), now.get(k, "?")) for k in ENV_KEYS if tags.get(k, "?") != now.get(k, "?")]
    console.print(f"[bold]reproducing run {args.run_id}[/] ({run.info.run_name}, experiment {experiment})")
    for k, was, is_ in differs:
        console.print(f"  [yellow]environment differs[/]: {k.removeprefix('env.')} was {was}, now {is_}")

    # Same epochs as the original: a pruned or early-stopped trial ran fewer than max_epochs. It keeps
    # its configured max_epochs (the LR schedule is a function of it) and stops after those epochs.
    compared = tuple(dict.fromkeys((*COMPARED, config["metric"])))
    history = {m: {h.step: h.value for h in client.get_metric_history(args.run_id, m)} for m in compared}
    epochs = max(history["val_loss"], default=0)
    if epochs == 0:
        raise UserError(f"run {args.run_id} logged no epochs: nothing to compare")
    trainer = {**config["trainer"], "inject_nan_at_step": None, "inject_oom_at_step": None}
    if tags.get("hpolab.trainer_overrides"):
        console.print(f"  [yellow]note[/]: this attempt ran with {tags['hpolab.trainer_overrides']} (after a CUDA OOM); "
                      "epochs it carried over from an earlier attempt were trained without it")
    torch.set_num_threads(int(tags.get("hpolab.torch_threads", "1")))
    exp = load_experiment(experiment)
    seed_everything(config["seed"], bool(trainer.get("deterministic", False)))  # as the trial process did
    data = exp.load_data(config["data"], config["seed"])
    model = exp.build_model(config["model"], data.input_shape, data.num_classes)
    with tempfile.TemporaryDirectory() as ckpt:
        result = fit(trainer_config(trainer), model, data, metric=config["metric"], direction=config["direction"],
                     seed=config["seed"], checkpoint_dir=ckpt, task=task_for(exp),
                     on_epoch=lambda epoch, _metrics: epoch >= epochs)

    table = Table(title=f"{run.info.run_name}: original vs reproduced")
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
    console.print(table)
    ok = worst <= args.tolerance
    verdict = "identical" if worst == 0 else f"max abs difference {worst:.3g}"
    console.print(f"{'[green]reproduced[/]' if ok else '[red]NOT reproduced[/]'}: {verdict} (tolerance {args.tolerance:g})"
                  + ("" if ok or not differs else "; the environment differs (above), which alone can explain it"))
    return 0 if ok else 1
