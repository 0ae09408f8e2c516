"""A custom task whose metrics are fixed by the trial's config: `model.point` names a point whose
(val_a, val_b, val_c) every epoch reports, whatever the training does. For tests of ranking, the
front and retention through the real CLI with values chosen in advance. Same data as `faulty`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from experiments.faulty import DATA_DEFAULTS, load_data  # noqa: F401

TASK = "custom"
METRIC_DIRECTIONS = {"val_a": "minimize", "val_b": "minimize", "val_c": "minimize"}
MODEL_DEFAULTS = {"point": "o", "points": {"o": [0.0, 0.0, 0.0]}}  # name -> [val_a, val_b, val_c]


class FixedPoint(nn.Module):
    """A tiny classifier whose output carries the point in three extra columns."""

    def __init__(self, point: list[float]):
        super().__init__()
        self.net = nn.Linear(64, 10)
        self.register_buffer("point", torch.tensor(point, dtype=torch.float32))

    def forward(self, x):
        logits = self.net(x)
        return torch.cat([logits, self.point.expand(len(x), 3)], dim=1)


def build_model(model: dict, input_shape, num_classes) -> nn.Module:
    return FixedPoint([float(v) for v in model["points"][model["point"]]])


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs[:, :10], targets)


def metrics(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    a, b, c = outputs[0, 10:13].tolist()
    return {"val_a": a, "val_b": b, "val_c": c}
