"""A Lightning callback that reports each validated epoch to an hpolab trial.

    from hpolab.integrations.lightning import HpolabCallback, resume_path

    def train(config, trial):
        trainer = lightning.Trainer(max_epochs=config["trainer"]["max_epochs"], enable_checkpointing=False,
                                    callbacks=[HpolabCallback(trial)], ...)
        trainer.fit(module, train_loader, val_loader, ckpt_path=resume_path(trial))
        trial.log_model(module.net, example_batch)

Per epoch that ran validation, at the end of the training epoch (then `trainer.callback_metrics` holds
the epoch's validation metrics and the epoch aggregates of what training_step logged; at the end of
validation the training aggregates would still be the previous epoch's), the callback calls
`trial.report(epoch, metrics, checkpoint=...)` with the epoch 1-based, every scalar of
`trainer.callback_metrics` as a float, and Lightning's full checkpoint of that moment (what
`trainer.save_checkpoint` writes: weights, optimizers, schedulers, loop state). When the trial must
stop (pruned, or the study is stopping) it sets `trainer.should_stop`, and fit ends after this epoch.

A retried or resumed trial restarts from that checkpoint: `resume_path(trial)` writes it to a file for
`trainer.fit(..., ckpt_path=...)` (the callback deletes that file once fit has read it), and Lightning
continues at the next epoch (its epoch counter is in the checkpoint, so the reported epochs continue
too). When the resume changed `trainer.lr`, `weight_decay`, `momentum` or `betas` (PBT's explore), the
callback gives them to the restored optimizers (`trial.apply_config_changes`) before training goes on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ModuleNotFoundError:  # one line for the user, not a chain of two tracebacks
    raise ModuleNotFoundError("hpolab.integrations.lightning needs Lightning: pip install hpolab[lightning]") from None

RESUME_FILE = "lightning-resume.ckpt"  # in trial.dir: the restored checkpoint, for fit(ckpt_path=...)


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The scalars among logged metrics (0-d or one-element tensors, numbers) as floats, one per name:
    a metric logged on step and on epoch (`self.log("train_loss", ..., on_epoch=True)` in training_step)
    is the epoch's, under its own name (Lightning's `train_loss_step` and `train_loss_epoch` are not kept)."""
    out = {}
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            out[name] = float(value.detach().cpu().reshape(()))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    for name in [n for n in out if n.endswith("_epoch")]:
        base = name.removesuffix("_epoch")
        out.pop(base + "_step", None)
        out[base] = out.pop(name)
    return out


def full_checkpoint(trainer: Trainer) -> dict[str, Any]:
    """The dict `trainer.save_checkpoint(path)` would write, without writing it.

    save_checkpoint is `_checkpoint_connector.dump_checkpoint(weights_only)` followed by the strategy's
    torch.save on rank 0 (lightning 2.4 to 2.6); this is its first half, the least private way to the
    dict. Its tensors are the live ones: the trial saves them at once, before training goes on.
    """
    return trainer._checkpoint_connector.dump_checkpoint(weights_only=False)


class HpolabCallback(Callback):
    """Reports each validated epoch to `trial` (metrics and Lightning's checkpoint); stops on its word.

    `checkpoint=False` reports metrics only (a retry then starts the trial over). Metrics logged in the
    LightningModule's own `on_train_epoch_end` are not seen (Lightning calls callbacks' hook first):
    log in `training_step` / `validation_step` with `self.log(..., on_epoch=True)` as usual.
    """

    def __init__(self, trial: Any, *, checkpoint: bool = True) -> None:
        self.trial = trial
        self.checkpoint = checkpoint
        self._validated_epoch: int | None = None  # the last epoch whose validation ran (not the sanity check)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # fit has read the restored checkpoint by now: leave no second copy of it in the trial's folder
        if trainer.ckpt_path and Path(trainer.ckpt_path) == Path(self.trial.dir) / RESUME_FILE:
            Path(trainer.ckpt_path).unlink(missing_ok=True)
        # ... and restored the optimizers and LR schedulers: a trial scheduler's new trainer.lr (weight
        # decay, momentum, betas) replaces what they brought back from the checkpoint (PBT's explore)
        for optimizer in trainer.optimizers:
            schedulers = [c.scheduler for c in trainer.lr_scheduler_configs if getattr(c.scheduler, "optimizer", None) is optimizer]
            self.trial.apply_config_changes(optimizer, schedulers)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated_epoch = trainer.current_epoch

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._validated_epoch != trainer.current_epoch:
            return  # no validation this epoch (check_val_every_n_epoch > 1): nothing new to report
        metrics = scalar_metrics(trainer.callback_metrics)
        state = full_checkpoint(trainer) if self.checkpoint else None
        if self.trial.report(trainer.current_epoch + 1, metrics, checkpoint=state):
            trainer.should_stop = True


def resume_path(trial: Any) -> str | None:
    """The checkpoint an earlier attempt of this trial reported, as a file for
    `trainer.fit(..., ckpt_path=resume_path(trial))`; None for a fresh trial (fit then starts at epoch 1)."""
    state = trial.restore()
    if state is None:
        return None
    path = Path(trial.dir) / RESUME_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return str(path)
