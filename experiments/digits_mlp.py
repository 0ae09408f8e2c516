"""Handwritten digits (scikit-learn's bundled 8x8 images) with a small MLP: the multi-fidelity benchmark's task.

Same data and split as digits_cnn (60% train, 20% val, 20% test, stratified from the data seed), flattened to
64 features in [-1, 1]. An epoch takes milliseconds, so a study's time is mostly the platform's per-trial
cost and the benchmark can afford dozens of trials of 27 epochs. With plain SGD and a constant LR the
configurations differ a lot (lr 1e-4 barely learns in 27 epochs, lr near 1 diverges), and slow
configurations keep improving late: what ASHA and PBT must cope with.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train.data import DataSplits
from hpolab.train.sklearn_data import load_digits  # scikit-learn's bundled file, no download

DATA_DEFAULTS = {"val_fraction": 0.2, "test_fraction": 0.2}

MODEL_DEFAULTS = {
    "width": 64,  # hidden units per layer
    "depth": 2,  # hidden layers
    "dropout": 0.0,
}

PIXEL_MAX = 16.0  # sklearn digits pixels are integers 0..16


def preprocess(raw: torch.Tensor) -> torch.Tensor:
    """Raw digits (N, 8, 8) or (N, 64), values 0..16 -> model input (N, 64) in [-1, 1]."""
    x = torch.as_tensor(raw, dtype=torch.float32).reshape(-1, 64)
    return x / (PIXEL_MAX / 2) - 1.0


def _raw_and_split(data: dict, data_seed: int):
    images, target = load_digits()
    x_raw, y = images.astype(np.float32), target.astype(np.int64)
    rng = np.random.default_rng(data_seed)
    train, val, test = [], [], []
    for c in np.unique(y):  # stratified, like digits_cnn
        idx = rng.permutation(np.flatnonzero(y == c))
        n_val, n_test = round(len(idx) * data["val_fraction"]), round(len(idx) * data["test_fraction"])
        val.extend(idx[:n_val])
        test.extend(idx[n_val : n_val + n_test])
        train.extend(idx[n_val + n_test :])
    return x_raw, y, tuple(np.sort(np.array(a)) for a in (train, val, test))


def load_data(data: dict, data_seed: int) -> DataSplits:
    x_raw, y, (train, val, test) = _raw_and_split(data, data_seed)
    x, labels = preprocess(torch.from_numpy(x_raw)), torch.from_numpy(y)

    def split(idx):
        return TensorDataset(x[idx], labels[idx])

    return DataSplits(
        train=split(train), val=split(val), test=split(test),
        num_classes=10,
        input_shape=(64,),
        class_names=tuple(str(i) for i in range(10)),
        preprocess=preprocess,
        info={"source": "sklearn.datasets.load_digits", "n_train": len(train), "n_val": len(val), "n_test": len(test)},
    )


def raw_test(data: dict, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs float32 (N, 8, 8), values 0..16; labels int64 (N,)) in the order of load_data(data, data_seed).test."""
    x_raw, y, (_, _, test) = _raw_and_split(data, data_seed)
    return x_raw[test], y[test]


def build_model(model: dict, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    width, n_in, layers = int(model["width"]), input_shape[0], []
    for _ in range(int(model["depth"])):
        layers += [nn.Linear(n_in, width), nn.ReLU(), nn.Dropout(float(model["dropout"]))]
        n_in = width
    layers.append(nn.Linear(n_in, num_classes))
    return nn.Sequential(*layers)
