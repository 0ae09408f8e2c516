"""What an experiment hands the training routine: train/val/test splits and their shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.utils.data import Dataset, TensorDataset


@dataclass(frozen=True)
class DataSplits:
    """The data of one trial.

    `train`, `val`, `test` are torch Datasets yielding (input, target): an int label for classification,
    float values for regression, a 0/1 row for multilabel (the experiment's TASK says which).
    `num_classes` is the number of model outputs: classes, regression targets or labels. A `TensorDataset`
    (inputs, labels) is treated as in-memory data: the routine indexes the tensors directly
    (kept on the GPU when one is used) instead of going through a DataLoader.
    `train_transform`, for in-memory data only, is applied to each training batch (augmentation);
    torchvision-style datasets carry their transforms themselves.
    `preprocess` turns raw inputs (as the user has them, e.g. uint8 images) into model inputs;
    promote/predict use it so inference matches training exactly.
    """

    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int
    input_shape: tuple[int, ...]  # one sample, without the batch axis
    class_names: tuple[str, ...] = ()
    train_transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    preprocess: Callable[[torch.Tensor], torch.Tensor] | None = None
    info: dict = field(default_factory=dict)  # free-form facts worth logging (sizes, source)


def data_seed_of(config: dict) -> int:
    """The seed an experiment splits its data with (`load_data(data, data_seed)`, `raw_test`): the
    study's `data_seed`, fixed for the study, apart from the training seed `seed` (initial weights,
    data order, dropout, augmentation), so that a configuration trained again on another seed (a
    promotion race, a noise probe) and the promotion gate see the same splits. A config recorded
    before the two were apart has only `seed`, which split its data then."""
    return int(config.get("data_seed", config["seed"]))


def is_in_memory(ds: Dataset) -> bool:
    return isinstance(ds, TensorDataset) and len(ds.tensors) == 2


def targets_of(ds: Dataset) -> torch.Tensor:
    """All targets of a split as one tensor, as the experiment made them (any task)."""
    if is_in_memory(ds):
        return ds.tensors[1]
    targets = getattr(ds, "targets", None)
    if targets is not None:
        return torch.as_tensor(targets)
    return torch.stack([torch.as_tensor(ds[i][1]) for i in range(len(ds))])


def labels_of(ds: Dataset) -> torch.Tensor:
    """All labels of a split as a 1-D int64 tensor (for class weights and samplers)."""
    if is_in_memory(ds):
        return ds.tensors[1].long()
    targets = getattr(ds, "targets", None)
    if targets is not None:
        return torch.as_tensor(targets).long()
    return torch.tensor([int(ds[i][1]) for i in range(len(ds))], dtype=torch.long)
