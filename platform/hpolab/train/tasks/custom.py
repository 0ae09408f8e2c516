"""Task custom: the experiment's own loss and metrics (and optional predict for serving)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..config import TrainConfig
from .common import foreign_options


class Custom:
    """The experiment's own `loss(outputs, targets)` and `metrics(outputs, targets) -> dict[str, float]`,
    with `METRIC_DIRECTIONS = {"val_iou": "maximize", ...}` (names with or without the val_ prefix)."""

    name = "custom"
    target_dtype = None  # targets reach the loss as the experiment made them
    numpy_target_dtype = None

    def __init__(self, loss: Callable, metrics: Callable, directions: dict[str, str], predict: Callable | None = None):
        self.loss, self.metrics, self.predict = loss, metrics, predict
        self.directions = {strip_val_prefix(k): v for k, v in directions.items()}

    def metric_directions(self, cfg: TrainConfig, num_outputs: int | None = None) -> dict[str, str]:
        return {"val_loss": "minimize", **{f"val_{k}": v for k, v in self.directions.items()}}

    def direction_of(self, metric: str, cfg: TrainConfig) -> str | None:
        return self.metric_directions(cfg).get(metric)

    def metric_hint(self, metric: str) -> str:
        return " (a custom task's metrics are the names in the experiment's METRIC_DIRECTIONS)"

    def check_config(self, cfg: TrainConfig) -> list[str]:
        return foreign_options(self.name, cfg, ())

    def check_targets(self, targets: torch.Tensor, num_outputs: int) -> None:
        return None  # the experiment's loss knows its targets

    def bind(self, cfg: TrainConfig, data, device: torch.device) -> "BoundCustom":
        return BoundCustom(self)

    def unbound(self, num_outputs: int) -> "BoundCustom":
        return BoundCustom(self)


def strip_val_prefix(name: str) -> str:
    return name[len("val_"):] if name.startswith("val_") else name


class _Predict(nn.Module):
    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, outputs: torch.Tensor) -> torch.Tensor:
        return self.fn(outputs)


@dataclass
class BoundCustom:
    task: Custom

    def criterion(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.task.loss(outputs, targets)

    def val_loss_sum(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.task.loss(outputs, targets).double() * len(outputs)

    def keep(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs

    def split_metrics(self, kept: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        got = {strip_val_prefix(k): float(v) for k, v in self.task.metrics(kept, targets).items()}
        missing = set(self.task.directions) - set(got)
        if missing:
            raise ValueError(f"task custom: the experiment's metrics() did not return {', '.join(sorted(missing))} "
                             "(declared in METRIC_DIRECTIONS)")
        return got

    def epoch_metrics(self, val: dict[str, Any]) -> dict[str, float]:
        return {f"val_{k}": val[k] for k in self.task.directions}

    def head(self) -> nn.Module | None:
        return _Predict(self.task.predict) if self.task.predict is not None else None

    def evaluate_served(self, served: torch.Tensor, y) -> dict[str, float]:
        # served = the experiment's predict(outputs) when it has one: its metrics must accept those
        y = torch.as_tensor(y)
        return {"loss": float(self.task.loss(served, y)), **self.split_metrics(served, y), "n": int(len(y))}
