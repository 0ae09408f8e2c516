"""The 8x8 digits with noisy training labels and a small MLP: a task whose best learning rate changes.

Same data and stratified split as digits_mlp (60% train, 20% val, 20% test, from the data seed), but a share
`label_noise` of the *training* labels is replaced by a uniformly drawn class (fixed by the data seed; val
and test keep their true labels). With plain SGD (no momentum) a high LR learns the clean signal fast
but keeps jumping between noisy minibatches, and a low LR is steady but slow: a high-then-low LR
schedule beats every constant LR (bench/multifidelity.py --pbt-task lr-decay measures it), which is
the situation population based training should find a schedule for.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train.data import DataSplits
from hpolab.train.sklearn_data import load_digits  # scikit-learn's bundled file, no download

DATA_DEFAULTS = {"val_fraction": 0.2, "test_fraction": 0.2, "label_noise": 0.6}

MODEL_DEFAULTS = {"width": 64, "depth": 2}

PIXEL_MAX = 16.0  # sklearn digits pixels are integers 0..16
NUM_CLASSES = 10


def preprocess(raw: torch.Tensor) -> torch.Tensor:
    """Raw digits (N, 8, 8) or (N, 64), values 0..16 -> model input (N, 64) in [-1, 1]."""
    return torch.as_tensor(raw, dtype=torch.float32).reshape(-1, 64) / (PIXEL_MAX / 2) - 1.0


def split_indices(y: np.ndarray, data: dict, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Stratified (train, val, test) index arrays, sorted."""
    train, val, test = [], [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_val, n_test = round(len(idx) * data["val_fraction"]), round(len(idx) * data["test_fraction"])
        val.extend(idx[:n_val])
        test.extend(idx[n_val : n_val + n_test])
        train.extend(idx[n_val + n_test :])
    return tuple(np.sort(np.array(a)) for a in (train, val, test))


def noisy(labels: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
    """A copy of `labels` where each one, with probability `share`, is redrawn uniformly from the classes."""
    out = labels.copy()
    flip = rng.random(len(out)) < share
    out[flip] = rng.integers(0, NUM_CLASSES, int(flip.sum()))
    return out


def load_data(data: dict, data_seed: int) -> DataSplits:
    if not 0.0 <= float(data["label_noise"]) < 1.0:
        raise ValueError(f"data.label_noise must be in [0, 1), got {data['label_noise']!r}")
    images, target = load_digits()
    rng = np.random.default_rng(data_seed)
    y = target.astype(np.int64)
    train, val, test = split_indices(y, data, rng)
    x = preprocess(torch.from_numpy(images.astype(np.float32)))
    y_train = torch.from_numpy(noisy(y[train], float(data["label_noise"]), rng))
    labels = torch.from_numpy(y)
    return DataSplits(
        train=TensorDataset(x[train], y_train), val=TensorDataset(x[val], labels[val]),
        test=TensorDataset(x[test], labels[test]),
        num_classes=NUM_CLASSES,
        input_shape=(64,),
        class_names=tuple(str(i) for i in range(NUM_CLASSES)),
        preprocess=preprocess,
        info={"source": "sklearn.datasets.load_digits", "label_noise": float(data["label_noise"]),
              "n_train": len(train), "n_val": len(val), "n_test": len(test)},
    )


def build_model(model: dict, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    width, n_in, layers = int(model["width"]), input_shape[0], []
    for _ in range(int(model["depth"])):
        layers += [nn.Linear(n_in, width), nn.ReLU()]
        n_in = width
    layers.append(nn.Linear(n_in, num_classes))
    return nn.Sequential(*layers)
