"""One bias learning by plain SGD, trained by hpolab's routine (load_data + build_model, a custom task).
bias_loop.py trains the very same model on the very same data with its own loop, so the tests can hold
both kinds of experiment to the same behaviour.

The model's output is its bias b (its inputs are zeros), trained towards 1.0 by a mean squared error
from b = 0, each batch the same (tests/one_path.py has the arithmetic of its records): at batch_size 8,
one step an epoch, b after epoch k = b + 2 * lr * (1 - b), so a learning rate of 0.1 is nearest the
target 0.4 at epoch 2 of 4, and 0.2 at epoch 1. `val_pred` is b (which weights the model holds),
`val_score` is -|b - data.target|.
`model.sleep` (seconds) slows every training forward pass, to interrupt a trial mid-training;
`model.trace` (a file) gets a line with the process id for each (which attempt trained which epochs).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train.data import DataSplits

TASK = "custom"
METRIC_DIRECTIONS = {"val_score": "maximize", "val_pred": "maximize"}  # (val_pred: logged so tests can read b)
DATA_DEFAULTS = {"target": 0.4}  # what val and test ask the output to be (train asks 1.0)
MODEL_DEFAULTS = {"sleep": 0.0, "trace": ""}
ROWS = 8  # one batch at the spec's batch_size


def _split(value: float) -> TensorDataset:
    return TensorDataset(torch.zeros(ROWS, 4), torch.full((ROWS, 1), float(value)))


def load_data(data: dict, data_seed: int) -> DataSplits:
    return DataSplits(train=_split(1.0), val=_split(data["target"]), test=_split(data["target"]), num_classes=1, input_shape=(4,))


def raw_test(data: dict, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = _split(data["target"]).tensors
    return x.numpy(), y.numpy()


class Bias(nn.Module):
    def __init__(self, sleep: float, trace: str):
        super().__init__()
        self.linear, self.sleep, self.trace = nn.Linear(4, 1), float(sleep), trace
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.trace:
            with open(self.trace, "a") as f:
                f.write(f"{os.getpid()}\n")
        if self.training and self.sleep:
            time.sleep(self.sleep)
        return self.linear(x)


def build_model(model: dict, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return Bias(model["sleep"], model["trace"])


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(outputs, targets)


def metrics(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    return {"score": -float((outputs - targets).abs().mean()), "pred": float(outputs.mean())}
