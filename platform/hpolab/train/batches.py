"""Batches: what fit() and the LR sweep train on, and what validation reads.

In-memory splits (TensorDataset) are moved to the device once and indexed directly (no DataLoader,
no collate): the DataLoader is often the bottleneck for small models. Any other Dataset goes
through a DataLoader with the trainer's worker settings.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler
from torch.utils.data.distributed import DistributedSampler

from .config import TrainConfig
from .data import DataSplits, is_in_memory, labels_of
from .seeding import make_generator, seed_worker

Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]  # re-iterable: one pass is one epoch


class TensorBatches:
    """Batches of an in-memory split, by indexing its tensors directly (no DataLoader, no collate).

    The tensors should already be on the training device. Train order comes from `generator`
    (a fresh permutation, or weighted sampling with replacement, per epoch); without either the
    order is the stored one. drop_last drops a final partial batch, but only when there is more
    than one batch (a split smaller than batch_size still yields one batch).

    shard=(rank, world) (multi-device trials): every rank draws the same order (same generator
    state) and yields its contiguous 1/world of each batch, so the world ranks' parts of batch b
    are exactly the single-process batch b (same effective batch, same samples).
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
        sample_weights: torch.Tensor | None = None,
        drop_last: bool = False,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        shard: tuple[int, int] | None = None,
    ):
        self.x, self.y = x, y
        self.n = len(x)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.generator = generator
        self.sample_weights = sample_weights
        self.drop_last = drop_last
        self.transform = transform
        self.shard = shard

    def __len__(self) -> int:
        if self.drop_last and self.n > self.batch_size:
            return self.n // self.batch_size
        return math.ceil(self.n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = None
        if self.sample_weights is not None:
            order = torch.multinomial(self.sample_weights, self.n, replacement=True, generator=self.generator)
        elif self.shuffle:
            order = torch.randperm(self.n, generator=self.generator)
        if order is not None:
            order = order.to(self.x.device)
        for b in range(len(self)):
            lo, hi = b * self.batch_size, min((b + 1) * self.batch_size, self.n)
            if self.shard is not None:
                lo, hi = shard_bounds(lo, hi, *self.shard)
            if order is None:
                x, y = self.x[lo:hi], self.y[lo:hi]
            else:
                idx = order[lo:hi]
                x, y = self.x[idx], self.y[idx]  # advanced indexing copies: transforms may work in place
            if self.transform is not None:
                x = self.transform(x)
            yield x, y


def shard_bounds(lo: int, hi: int, rank: int, world: int) -> tuple[int, int]:
    """This rank's contiguous part of the batch [lo, hi): the world parts together are that batch."""
    size = hi - lo
    return lo + size * rank // world, lo + size * (rank + 1) // world


def inverse_frequency_sample_weights(labels: torch.Tensor) -> torch.Tensor:
    # Each sample weighs 1/count(its class): every class is drawn equally often in expectation.
    counts = torch.bincount(labels)
    return (1.0 / counts.double())[labels]


def train_batches(
    cfg: TrainConfig,
    data: DataSplits,
    device: torch.device,
    generator: torch.Generator,
    note: Callable[[str], None] = lambda message: None,
    target_dtype: torch.dtype | None = torch.long,
    shard: tuple[int, int] | None = None,
) -> TensorBatches | DataLoader:
    """One epoch of training micro-batches per pass: shuffled (or balanced), drop_last (keeping >= 1 batch).

    `generator` drives the order (and the DataLoader workers' base seeds); the global RNGs are not used.
    shard=(rank, world): this rank's share of every batch (batch_size / world samples), see TensorBatches.
    """
    sample_weights = inverse_frequency_sample_weights(labels_of(data.train)) if cfg.balanced_sampler else None
    if is_in_memory(data.train):
        x, y = data.train.tensors
        # Moved to the device once; every batch is then a gather on the device.
        return TensorBatches(
            x.to(device),
            as_targets(y.to(device), target_dtype),
            cfg.batch_size,
            shuffle=True,
            generator=generator,
            sample_weights=sample_weights,
            drop_last=True,
            transform=data.train_transform,
            shard=shard,
        )
    if shard is not None:
        return _distributed_loader(cfg, data, device, generator, shard, sample_weights)
    if data.train_transform is not None:
        note("data.train_transform ignored: it applies to in-memory (TensorDataset) data; give the Dataset its transforms")
    sampler = None
    if sample_weights is not None:
        sampler = WeightedRandomSampler(sample_weights, num_samples=len(data.train), replacement=True, generator=generator)
    return DataLoader(
        data.train,
        batch_size=cfg.batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        drop_last=len(data.train) > cfg.batch_size,  # avoid a 1-sample BatchNorm batch, keep >= 1 batch
        num_workers=cfg.num_workers,
        pin_memory=device.type == "cuda",  # page-locked host memory: async (non_blocking) copies
        persistent_workers=cfg.num_workers > 0,  # no worker start-up cost every epoch (or every cycle)
        worker_init_fn=seed_worker,
        generator=generator,  # shuffle order and worker base seeds
    )


def _distributed_loader(cfg: TrainConfig, data: DataSplits, device: torch.device, generator: torch.Generator,
                        shard: tuple[int, int], sample_weights) -> DataLoader:
    """A Dataset on one of `world` ranks: DistributedSampler (the loop calls set_epoch), batch_size / world per rank."""
    rank, world = shard
    if sample_weights is not None:
        raise ValueError("balanced_sampler with devices > 1 needs in-memory (TensorDataset) data; use class_weighting instead")
    # Same seed on every rank: one permutation per epoch (set_epoch), split between the ranks.
    sampler = DistributedSampler(data.train, num_replicas=world, rank=rank, shuffle=True, seed=generator.initial_seed(), drop_last=True)
    return DataLoader(
        data.train,
        batch_size=cfg.batch_size // world,
        sampler=sampler,
        drop_last=len(data.train) > cfg.batch_size,
        num_workers=cfg.num_workers,
        pin_memory=device.type == "cuda",
        persistent_workers=cfg.num_workers > 0,
        worker_init_fn=seed_worker,
        generator=generator,  # worker base seeds
    )


def forever(batches: Batches) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Cycle epochs of `batches` without end (each pass reshuffles, as a new epoch of fit() would)."""
    while True:
        yield from batches


def eval_batches(dataset: Dataset, batch_size: int, device: torch.device, num_workers: int = 0, seed: int = 0,
                 target_dtype: torch.dtype | None = torch.long):
    """Batches of a validation/test split, in stored order, keeping every sample."""
    if is_in_memory(dataset):
        x, y = dataset.tensors
        return TensorBatches(x.to(device), as_targets(y.to(device), target_dtype), batch_size)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        drop_last=False,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        persistent_workers=num_workers > 0,
        worker_init_fn=seed_worker,
        # Its own generator: validation must not advance the train split's shuffle stream.
        generator=make_generator(seed + 1),
    )


def as_targets(y: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """Targets in the task's dtype (int64 labels for classification, float32 values otherwise; None: as given)."""
    return y.long() if dtype == torch.long else (y if dtype is None else y.to(dtype))


def to_device(x: torch.Tensor, y: torch.Tensor, device: torch.device, channels_last: bool, target_dtype: torch.dtype | None = torch.long):
    # non_blocking: with pinned host memory the copy overlaps compute; a no-op for on-device tensors.
    x = x.to(device, non_blocking=True)
    y = as_targets(y.to(device, non_blocking=True), target_dtype)
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y
