"""What every task shares: the task names, and which trainer options belong to which task (so that a
task can name the options set for another one)."""

from __future__ import annotations

from ..config import TrainConfig

TASKS = ("classification", "regression", "multilabel", "custom")
RUN_METRICS = ("train_loss",)  # besides the task's val_* metrics; minimized


def _defaults() -> TrainConfig:
    return TrainConfig()


def _changed(cfg: TrainConfig, names: tuple[str, ...]) -> list[str]:
    d = _defaults()
    return [n for n in names if getattr(cfg, n) != getattr(d, n)]


CLASSIFICATION_ONLY = ("label_smoothing", "focal_gamma", "balanced_sampler")
REGRESSION_ONLY = ("regression_loss", "standardize_targets")
MULTILABEL_ONLY = ("multilabel_threshold",)


def foreign_options(task: str, cfg: TrainConfig, own: tuple[str, ...]) -> list[str]:
    """Trainer options set away from their default that belong to another task."""
    every = CLASSIFICATION_ONLY + REGRESSION_ONLY + MULTILABEL_ONLY + ("class_weighting",)
    foreign = [n for n in every if n not in own]
    return [f"trainer.{n}: applies to {_owner(n)}, not to task {task}; remove it" for n in _changed(cfg, tuple(foreign))]


def _owner(name: str) -> str:
    if name in REGRESSION_ONLY:
        return "task regression"
    if name in MULTILABEL_ONLY:
        return "task multilabel"
    if name == "class_weighting":
        return "tasks classification and multilabel"
    return "task classification"
