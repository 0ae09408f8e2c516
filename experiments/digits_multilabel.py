"""Multi-label digits: scikit-learn's bundled 8x8 digits (real, offline) with three yes/no labels per
image -- is the digit even, is it greater than 4, does it have a closed loop (0, 6, 8, 9) -- and a
small MLP. Shows TASK = "multilabel": 0/1 targets (N, 3), BCE-with-logits, micro/macro-F1 and mean
average precision; serving returns one probability per label.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train.data import DataSplits
from hpolab.train.sklearn_data import load_digits  # scikit-learn's bundled file, no download (and no sklearn import)

TASK = "multilabel"
LABELS = ("even", "greater_than_4", "loop")

DATA_DEFAULTS = {"val_fraction": 0.2, "test_fraction": 0.2}
MODEL_DEFAULTS = {"width": 64, "dropout": 0.1}

PIXEL_MAX = 16.0


def preprocess(raw: torch.Tensor) -> torch.Tensor:
    """Raw digits (N, 8, 8) with values 0..16 -> (N, 64) in [-1, 1]."""
    return torch.as_tensor(raw, dtype=torch.float32).reshape(-1, 64) / (PIXEL_MAX / 2) - 1.0


def _labels(digit: np.ndarray) -> np.ndarray:
    return np.stack([digit % 2 == 0, digit > 4, np.isin(digit, (0, 6, 8, 9))], axis=1).astype(np.float32)


def _raw_and_split(data: dict, data_seed: int):
    images, target = load_digits()
    x = images.astype(np.float32)
    order = np.random.default_rng(data_seed).permutation(len(x))
    n_val, n_test = round(len(x) * data["val_fraction"]), round(len(x) * data["test_fraction"])
    val, test, train = order[:n_val], order[n_val : n_val + n_test], order[n_val + n_test :]
    return x, _labels(target), (np.sort(train), np.sort(val), np.sort(test))


def load_data(data: dict, data_seed: int) -> DataSplits:
    x_raw, y, (train, val, test) = _raw_and_split(data, data_seed)
    x, targets = preprocess(torch.from_numpy(x_raw)), torch.from_numpy(y)

    def split(idx):
        return TensorDataset(x[idx], targets[idx])

    return DataSplits(
        train=split(train), val=split(val), test=split(test),
        num_classes=len(LABELS),  # one output (logit) per label
        input_shape=(64,),
        class_names=LABELS,
        preprocess=preprocess,
        info={"source": "sklearn.datasets.load_digits (multi-label)", "n_train": len(train)},
    )


def raw_test(data: dict, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(raw digits float32 (N, 8, 8), 0/1 labels float32 (N, 3)) in the order of load_data(data, data_seed).test."""
    x_raw, y, (_, _, test) = _raw_and_split(data, data_seed)
    return x_raw[test], y[test]


def build_model(model: dict, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    width = int(model["width"])
    return nn.Sequential(
        nn.Linear(input_shape[0], width), nn.ReLU(), nn.Dropout(float(model["dropout"])),
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, num_classes),
    )
