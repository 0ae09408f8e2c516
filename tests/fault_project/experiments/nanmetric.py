"""A custom task whose only metric is never finite (a bug a user's metrics() can have): every epoch's
`val_score` is NaN, while the loss trains normally. Same data and model as `faulty`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from experiments.faulty import DATA_DEFAULTS, MODEL_DEFAULTS, build_model, load_data  # noqa: F401

TASK = "custom"
METRIC_DIRECTIONS = {"val_score": "maximize"}


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


def metrics(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    return {"val_score": float("nan")}
