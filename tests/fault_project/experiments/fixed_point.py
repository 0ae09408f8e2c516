"""A custom task whose metrics are fixed by the trial's config: `model.point` names a point whose
(val_a, val_b, val_c) every epoch reports, whatever the training does. For tests of ranking, the
front, retention and promote through the real CLI with values chosen in advance. Digits data."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train.data import DataSplits
from hpolab.train.sklearn_data import load_digits

TASK = "custom"
METRIC_DIRECTIONS = {"val_a": "minimize", "val_b": "minimize", "val_c": "minimize"}
DATA_DEFAULTS: dict = {}
MODEL_DEFAULTS = {"point": "o", "points": {"o": [0.0, 0.0, 0.0]}}  # name -> [val_a, val_b, val_c]


def preprocess(raw: torch.Tensor) -> torch.Tensor:
    """Raw digits (N, 64), values 0..16 -> model inputs in [0, 1]."""
    return torch.as_tensor(raw, dtype=torch.float32) / 16.0


def _raw(seed: int):
    images, target = load_digits()
    idx = np.random.default_rng(seed).permutation(len(target))
    return images.reshape(len(images), -1).astype(np.float32), target.astype(np.int64), idx


def load_data(data: dict, seed: int) -> DataSplits:
    x_raw, y, idx = _raw(seed)
    x, y = preprocess(torch.from_numpy(x_raw)), torch.from_numpy(y)
    tr, va, te = idx[:1000], idx[1000:1400], idx[1400:]
    return DataSplits(train=TensorDataset(x[tr], y[tr]), val=TensorDataset(x[va], y[va]), test=TensorDataset(x[te], y[te]),
                      num_classes=10, input_shape=(64,), preprocess=preprocess)


def raw_test(data: dict, seed: int):
    """The test split as a user has it, in load_data's order (promote evaluates it through preprocess)."""
    x_raw, y, idx = _raw(seed)
    return x_raw[idx[1400:]], y[idx[1400:]]


class FixedPoint(nn.Module):
    """A tiny classifier whose output carries the point in three extra columns."""

    def __init__(self, point: list[float]):
        super().__init__()
        self.net = nn.Linear(64, 10)
        self.register_buffer("point", torch.tensor(point, dtype=torch.float32))

    def forward(self, x):
        logits = self.net(x)
        return torch.cat([logits, torch.zeros_like(logits[:, :3]) + self.point], dim=1)  # (any batch size: exportable)


def build_model(model: dict, input_shape, num_classes) -> nn.Module:
    return FixedPoint([float(v) for v in model["points"][model["point"]]])


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs[:, :10], targets)


def metrics(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    a, b, c = outputs[0, 10:13].tolist()
    return {"val_a": a, "val_b": b, "val_c": c}
