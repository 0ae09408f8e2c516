"""Handwritten digits (scikit-learn's bundled 8x8 images, real and offline) with a small CNN.

1,797 images of 10 classes. Split once, stratified, from the study's data seed (`data_seed`, not the
training seed): 60% train, 20% val, 20% test. Every trial, every seed of a promotion race and the
promotion gate see the same split.
The whole dataset fits in memory, so the splits are TensorDatasets and the training routine
indexes them directly (no DataLoader).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train.data import DataSplits
from hpolab.train.layers import GlobalAvgPool
from hpolab.train.sklearn_data import load_digits  # scikit-learn's bundled file, no download (and no sklearn import)

# Imports live at module level on purpose: the study driver's forkserver preloads experiment
# modules, so what is imported here is paid once per study, not once per trial.

DATA_DEFAULTS = {
    "val_fraction": 0.2,
    "test_fraction": 0.2,
    "augment": False,  # random 1-pixel shifts of training batches
}

MODEL_DEFAULTS = {
    "channels": 16,  # width of the first conv block; doubles per block
    "depth": 2,  # conv blocks (each: conv-bn-relu, conv-bn-relu, maxpool after block 1 and 2)
    "dropout": 0.1,  # before the classifier
}

PIXEL_MAX = 16.0  # sklearn digits pixels are integers 0..16


def preprocess(raw: torch.Tensor) -> torch.Tensor:
    """Raw digits (N, 8, 8) or (N, 64) with values 0..16 -> model input (N, 1, 8, 8) in [-1, 1]."""
    x = torch.as_tensor(raw, dtype=torch.float32).reshape(-1, 1, 8, 8)
    return x / (PIXEL_MAX / 2) - 1.0


def _random_shift(x: torch.Tensor) -> torch.Tensor:
    # Geometric augmentation on a batch: shift every image by up to one pixel (zero padded).
    dx, dy = (int(v) for v in torch.randint(-1, 2, (2,)))
    x = torch.roll(x, shifts=(dy, dx), dims=(2, 3))
    if dy:
        x[:, :, (0 if dy > 0 else -1), :] = -1.0
    if dx:
        x[:, :, :, (0 if dx > 0 else -1)] = -1.0
    return x


def _stratified_split(y: np.ndarray, fractions: tuple[float, float], seed: int):
    rng = np.random.default_rng(seed)
    train, val, test = [], [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_val = round(len(idx) * fractions[0])
        n_test = round(len(idx) * fractions[1])
        val.extend(idx[:n_val])
        test.extend(idx[n_val : n_val + n_test])
        train.extend(idx[n_val + n_test :])
    return (np.sort(np.array(a)) for a in (train, val, test))


def _raw_and_split(data: dict, data_seed: int):
    images, target = load_digits()
    x_raw = images.astype(np.float32)  # (1797, 8, 8), 0..16 (integers: exact in float32)
    y = target.astype(np.int64)
    return x_raw, y, _stratified_split(y, (data["val_fraction"], data["test_fraction"]), data_seed)


def load_data(data: dict, data_seed: int) -> DataSplits:
    x_raw, y, (train_idx, val_idx, test_idx) = _raw_and_split(data, data_seed)
    x = preprocess(torch.from_numpy(x_raw))
    labels = torch.from_numpy(y)

    def split(idx):
        return TensorDataset(x[idx], labels[idx])

    return DataSplits(
        train=split(train_idx),
        val=split(val_idx),
        test=split(test_idx),
        num_classes=10,
        input_shape=(1, 8, 8),
        class_names=tuple(str(i) for i in range(10)),
        train_transform=_random_shift if data["augment"] else None,
        preprocess=preprocess,
        info={"source": "sklearn.datasets.load_digits", "n_train": len(train_idx), "n_val": len(val_idx), "n_test": len(test_idx)},
    )


def raw_test(data: dict, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The test split as the user has it: (inputs float32 (N, 8, 8), values 0..16; labels int64 (N,)),
    in the order of load_data(data, data_seed).test. preprocess(inputs) are that split's model inputs."""
    x_raw, y, (_, _, test_idx) = _raw_and_split(data, data_seed)
    return x_raw[test_idx], y[test_idx]


def build_model(model: dict, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    depth, width = int(model["depth"]), int(model["channels"])
    if not 1 <= depth <= 3:
        raise ValueError(f"model.depth must be 1..3 for 8x8 inputs, got {depth}")
    layers: list[nn.Module] = []
    in_ch = input_shape[0]
    for block in range(depth):
        out_ch = width * 2**block
        layers += [
            nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(inplace=True),
            nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(inplace=True),
        ]
        if block < 2:  # 8x8 -> 4x4 -> 2x2
            layers.append(nn.MaxPool2d(2))
        in_ch = out_ch
    layers += [GlobalAvgPool(), nn.Dropout(float(model["dropout"])), nn.Linear(in_ch, num_classes)]
    return nn.Sequential(*layers)
