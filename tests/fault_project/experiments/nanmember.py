"""A custom task whose metric breaks for the configurations that ask for it: `model.nan_metric: true`
makes every epoch's `val_score` NaN (a member whose metric broke, beside healthy ones), false gives
the accuracy. The loss trains normally either way. Same data and model as `faulty`, whose logits get
one more column: the flag the metric reads (not a parameter: an exploit's donor config decides it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from experiments import faulty
from experiments.faulty import DATA_DEFAULTS, load_data  # noqa: F401

TASK = "custom"
METRIC_DIRECTIONS = {"val_score": "maximize"}
MODEL_DEFAULTS = {**faulty.MODEL_DEFAULTS, "nan_metric": False}


class Flagged(nn.Module):
    def __init__(self, net: nn.Module, nan_metric: bool):
        super().__init__()
        self.net, self.nan_metric = net, nan_metric

    def forward(self, x):
        logits = self.net(x)
        return torch.cat([logits, torch.full_like(logits[:, :1], float(self.nan_metric))], dim=1)


def build_model(model: dict, input_shape, num_classes) -> nn.Module:
    return Flagged(faulty.build_model(model, input_shape, num_classes), bool(model["nan_metric"]))


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs[:, :-1], targets)


def metrics(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    if outputs[:, -1].mean() > 0.5:
        return {"val_score": float("nan")}
    return {"val_score": float((outputs[:, :-1].argmax(1) == targets).float().mean())}
