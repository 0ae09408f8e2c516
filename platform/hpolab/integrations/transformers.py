"""A Hugging Face `TrainerCallback` that reports each evaluation to an hpolab trial.

    from hpolab.integrations.transformers import HpolabCallback, LogitsModel, resume_folder

    def train(config, trial):
        args = TrainingArguments(output_dir=str(trial.dir / "hf"), eval_strategy="epoch", save_strategy="epoch",
                                 num_train_epochs=config["trainer"]["max_epochs"], report_to="none", ...)
        trainer = Trainer(model=model, args=args, ..., callbacks=[HpolabCallback(trial)])
        trainer.train(resume_from_checkpoint=resume_folder(trial))
        trial.log_model(LogitsModel(model), example_input_ids)

On each evaluation (one per epoch: `eval_strategy="epoch"`), the callback reports to the trial: the epoch
as a 1-based int and the evaluation's `eval_*` numbers (plus `train_loss`, the mean training loss the
Trainer logged since the previous evaluation, when it logged one: `logging_strategy="epoch"`); when the
trial must stop (pruned, or the study is stopping) it sets `control.should_training_stop`. The checkpoint
is the folder the Trainer writes right after that evaluation (`on_save`, `save_strategy="epoch"`): its
files packed into one dict of bytes, sent with the report (`trial.report(epoch, metrics, checkpoint=...)`).
A retried or resumed trial gets that folder back on disk from
`resume_folder(trial)`, for `trainer.train(resume_from_checkpoint=...)`, which restores weights, optimizer,
scheduler, RNG and the Trainer's step and epoch counters (so the reported epochs continue); the callback
deletes that copy once train() has read it. When the resume changed `trainer.lr`, `weight_decay`,
`momentum` or `betas` (PBT's explore), the callback gives them to the restored optimizer and scheduler
(`trial.apply_config_changes`). With `load_best_model_at_end`, the callback tells the trial which epoch
the weights the Trainer ends with are from (`trial.weights_epoch`), so `trial.log_model` after train()
logs them as that epoch's.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

try:
    import torch
    from torch import nn
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ModuleNotFoundError:  # one line for the user, not a chain of two tracebacks
    raise ModuleNotFoundError("hpolab.integrations.transformers needs transformers: pip install hpolab[transformers]") from None

RESUME_DIR = "hf-resume"  # in trial.dir: the restored checkpoint folder, for train(resume_from_checkpoint=...)


def pack_folder(folder: str | Path) -> dict[str, Any]:
    """A Trainer checkpoint folder as one torch.save-able dict of plain data: {"folder": its name,
    "files": {relative path: bytes}} (bytes load with torch.load(weights_only=True); no code runs)."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    return {"folder": folder.name, "files": files}


def unpack_folder(state: dict[str, Any], parent: str | Path) -> Path:
    """Write a pack_folder() dict back as `parent/<its folder name>` (replacing an older copy); returns it."""
    name = Path(state["folder"]).name  # a bare name: the packed paths cannot point outside `parent`
    folder = Path(parent) / name
    if folder.exists():
        shutil.rmtree(folder)
    for relative, data in state["files"].items():
        path = folder / relative
        if not path.resolve().is_relative_to(folder.resolve()):
            raise ValueError(f"checkpoint file {relative!r} points outside its folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class HpolabCallback(TrainerCallback):
    """Reports each evaluation's `eval_*` metrics to `trial`, stops on its word, checkpoints each save.

    `checkpoint=False` reports only (a retry then starts the trial over). Evaluation must be once per
    epoch (`eval_strategy="epoch"`): the trial's epochs are its step axis. With `save_strategy="epoch"`
    the report waits for the epoch's save and carries its folder (`trial.report(..., checkpoint=)`), so
    the platform keeps exactly that epoch's state with that epoch's metrics; any other save strategy
    reports at once and checkpoints whenever the Trainer saves.
    """

    def __init__(self, trial: Any, *, checkpoint: bool = True) -> None:
        self.trial = trial
        self.checkpoint = checkpoint
        self._train_loss: float | None = None  # the last training loss logged before an evaluation
        self._pending: tuple[int, dict[str, float]] | None = None  # a report waiting for its epoch's save
        self._stopping = False
        self._training = False  # between on_train_begin and on_train_end: a trainer.evaluate() after train() is not an epoch
        self._packed: list[Path] = []  # checkpoint folders sent to the trial: the trial's checkpoint holds them now

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if _strategy(args.eval_strategy) != "epoch":
            raise ValueError(f"HpolabCallback reports one evaluation per epoch: set TrainingArguments(eval_strategy='epoch'), "
                             f"not {_strategy(args.eval_strategy)!r}")
        self._stopping, self._pending, self._training = False, None, True
        # The Trainer has restored its optimizer and LR scheduler from a resumed checkpoint by now: a trial
        # scheduler's new trainer.lr (weight decay, momentum, betas) replaces what they brought back (PBT).
        if kwargs.get("optimizer") is not None:
            self.trial.apply_config_changes(kwargs["optimizer"], [kwargs.get("lr_scheduler")])

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs: dict | None = None, **kwargs) -> None:
        if logs and "loss" in logs:
            self._train_loss = float(logs["loss"])

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, metrics: dict | None = None, **kwargs) -> None:
        if self._stopping or not self._training:
            return  # after a stop, or outside train() (a final trainer.evaluate() call), nothing more is sent
        # train() has read a restored folder by its first evaluation: leave no second copy in the trial's folder
        shutil.rmtree(Path(self.trial.dir) / RESUME_DIR, ignore_errors=True)
        reported = {k: v for k, v in _numbers(metrics or {}).items() if k.startswith("eval_")}
        if self._train_loss is not None:
            reported["train_loss"], self._train_loss = self._train_loss, None
        epoch = max(1, int(math.floor(float(state.epoch or 0) + 0.5)))  # 1.0 after the first epoch, 2.0, ...
        if self.checkpoint and control.should_save and _strategy(args.save_strategy) == "epoch":
            self._pending = (epoch, reported)  # on_save follows in the same step: report with its folder
        else:
            self._report(control, epoch, reported, None)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if self._stopping or not self.checkpoint:
            return  # a stopped trial is not resumed: its last state is not needed
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"  # what the Trainer just wrote
        packed = pack_folder(folder) if folder.is_dir() else None
        if packed is not None:
            self._packed.append(folder)
        if self._pending is not None:
            (epoch, metrics), self._pending = self._pending, None
            self._report(control, epoch, metrics, packed)
        elif packed is not None:
            self.trial.checkpoint(packed)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if self._pending is not None:  # a save that never came: the metrics still count
            (epoch, metrics), self._pending = self._pending, None
            self._report(control, epoch, metrics, None)
        self._training = False
        if args.load_best_model_at_end and state.best_model_checkpoint:  # the model holds that epoch's weights now
            self.trial.weights_epoch = _epoch_of(state, state.best_model_checkpoint)
        # The Trainer is done with its folders (a best model is loaded before this call); the packed ones
        # live on in the trial's checkpoint, and left in trial.dir they would cost a model's size per trial.
        for folder in self._packed:
            shutil.rmtree(folder, ignore_errors=True)
        self._packed = []

    def _report(self, control: TrainerControl, epoch: int, metrics: dict[str, float], checkpoint: dict | None) -> None:
        if self.trial.report(epoch, metrics, checkpoint=checkpoint):
            self._stopping = True
            control.should_training_stop = True  # the Trainer ends after this step's evaluate/save


def _epoch_of(state: TrainerState, checkpoint: str) -> int | None:
    """The epoch (1-based) of a `checkpoint-<step>` folder: its step's evaluation in the Trainer's log."""
    step = Path(checkpoint).name.rpartition("-")[2]
    for entry in state.log_history:
        if str(entry.get("step")) == step and "eval_loss" in entry:
            return max(1, int(math.floor(float(entry["epoch"]) + 0.5)))
    return None


def _strategy(value: Any) -> str:
    return str(getattr(value, "value", value))  # IntervalStrategy / SaveStrategy are str enums


def resume_folder(trial: Any) -> str | None:
    """The checkpoint folder an earlier attempt of this trial saved, unpacked under trial.dir, for
    `trainer.train(resume_from_checkpoint=resume_folder(trial))`; None for a fresh trial."""
    state = trial.restore()
    if state is None:
        return None
    return str(unpack_folder(state, Path(trial.dir) / RESUME_DIR))


class LogitsModel(nn.Module):
    """A Hugging Face model as `forward(input_ids) -> logits`, a plain tensor in and out: the form the
    trial's logged model (MLflow's pytorch flavor, with a signature from one example) can save and serve."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits
