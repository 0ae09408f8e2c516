"""Diabetes progression (scikit-learn's bundled data, real and offline): regression with a small MLP.

442 patients, 10 raw clinical features (age, sex, bmi, blood pressure, six serum measurements), target:
a quantitative measure of disease progression one year later (25..346). Split once from the study's data seed
(`data_seed`, not the training seed): 60% train, 20% val, 20% test. Features are standardized with the train split's mean/std inside
`preprocess`, so serving takes the raw features; targets are standardized by the platform when the
spec says `trainer.standardize_targets: true` (metrics, serving and predict stay in the target's units).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train.data import DataSplits
from hpolab.train.sklearn_data import load_diabetes_raw  # scikit-learn's bundled files, no download (and no sklearn import)

TASK = "regression"

DATA_DEFAULTS = {"val_fraction": 0.2, "test_fraction": 0.2}

MODEL_DEFAULTS = {
    "width": 64,  # hidden units per layer
    "depth": 2,  # hidden layers
    "dropout": 0.1,
}


def _raw_and_split(data: dict, data_seed: int):
    features, target = load_diabetes_raw()
    x = features.astype(np.float32)  # (442, 10) raw units
    y = target.astype(np.float32)  # (442,)
    order = np.random.default_rng(data_seed).permutation(len(y))
    n_val, n_test = round(len(y) * data["val_fraction"]), round(len(y) * data["test_fraction"])
    val, test, train = order[:n_val], order[n_val : n_val + n_test], order[n_val + n_test :]
    return x, y, (np.sort(train), np.sort(val), np.sort(test))


def _make_preprocess(x_train: np.ndarray):
    mean = torch.from_numpy(x_train.mean(0))
    std = torch.from_numpy(x_train.std(0))

    def preprocess(raw: torch.Tensor) -> torch.Tensor:
        """Raw features (N, 10) in clinical units -> standardized with the train split's statistics."""
        return (torch.as_tensor(raw, dtype=torch.float32) - mean) / std

    return preprocess


def load_data(data: dict, data_seed: int) -> DataSplits:
    x_raw, y, (train, val, test) = _raw_and_split(data, data_seed)
    preprocess = _make_preprocess(x_raw[train])
    x = preprocess(torch.from_numpy(x_raw))
    targets = torch.from_numpy(y)

    def split(idx):
        return TensorDataset(x[idx], targets[idx])

    return DataSplits(
        train=split(train), val=split(val), test=split(test),
        num_classes=1,  # one model output: the predicted progression
        input_shape=(10,),
        preprocess=preprocess,
        info={"source": "sklearn.datasets.load_diabetes", "n_train": len(train), "n_val": len(val), "n_test": len(test)},
    )


def raw_test(data: dict, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(raw features float32 (N, 10), targets float32 (N,)) in the order of load_data(data, data_seed).test."""
    x_raw, y, (_, _, test) = _raw_and_split(data, data_seed)
    return x_raw[test], y[test]


def build_model(model: dict, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    width, layers, n_in = int(model["width"]), [], input_shape[0]
    for _ in range(int(model["depth"])):
        layers += [nn.Linear(n_in, width), nn.ReLU(), nn.Dropout(float(model["dropout"]))]
        n_in = width
    layers.append(nn.Linear(n_in, num_classes))
    return nn.Sequential(*layers)
