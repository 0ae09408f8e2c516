"""fit() across N processes: DistributedDataParallel, one process per device (trainer.devices > 1).

fit() runs the same loop in every process; what differs is behind one object, `Ranks`:

- the model is wrapped in DDP (gradients averaged across ranks in backward; `no_sync()` on the
  micro-steps of an accumulation group that do not end it, see epoch.py);
- each rank trains on its share of every batch: batch_size / world samples (the effective batch
  is the single-process one, so a study's numbers keep their meaning whatever the devices);
- the epoch's training statistics are all-reduced (train_loss is the mean over every rank's samples);
- rank 0 alone evaluates (the whole val split), asks the caller (`on_epoch`) and writes checkpoints;
  the metrics and the stop decision are broadcast from it, so every rank runs the same epochs and
  stops after the same one (the case Optuna's own DDP integration gets wrong, optuna#5849).

The single-process path never builds a Ranks and never calls torch.distributed.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any, Callable, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

T = TypeVar("T")


def init_ranks(rank: int, world: int, *, host: str, port: int, device: torch.device, timeout_s: float = 1800.0) -> "Ranks":
    """Join the process group (the TCPStore at host:port is served by the launcher): gloo on the CPU, nccl on CUDA.

    timeout_s bounds every collective: a backstop only -- the launcher ends all ranks as soon as one dies.
    """
    store = dist.TCPStore(host, port, world_size=world, is_master=False, timeout=timedelta(seconds=timeout_s))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    return Ranks(rank, world, device)


def close_ranks() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class Ranks:
    """This process's place among the trial's N processes, and the collectives fit() needs."""

    def __init__(self, rank: int, world: int, device: torch.device):
        self.rank, self.world, self.device = rank, world, device

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def micro_batch(self, batch_size: int) -> int:
        """Samples per micro-batch on each rank: the single-process micro-batch split N ways."""
        if batch_size % self.world:
            raise ValueError(f"batch_size ({batch_size}) must be divisible by devices ({self.world})")
        return batch_size // self.world

    def convert_batchnorm(self, model: nn.Module, sync: bool, note: Callable[[str], None]) -> None:
        """SyncBatchNorm in place (before the optimizer sees the parameters). torch's SyncBatchNorm runs on CUDA only."""
        if not sync:
            return
        if self.device.type != "cuda":
            note("sync_batchnorm ignored: torch's SyncBatchNorm needs CUDA; on the CPU each rank normalizes its own share")
            return
        converted = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        if converted is not model:  # the model itself is a BatchNorm layer: it cannot be replaced in place
            raise ValueError("sync_batchnorm: the model's top-level module is a BatchNorm layer; wrap it in a container")

    def wrap(self, net: nn.Module) -> nn.Module:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(net, device_ids=device_ids)

    def begin_epoch(self, batches: Any, epoch: int, seed: int) -> None:
        """Before training epoch `epoch`: the sampler's epoch, and this rank's own global RNG stream.

        Every rank draws dropout masks / augmentations from a stream of (seed, epoch, rank): ranks
        differ (no mirrored masks), and a resumed run draws what an uninterrupted one would have
        (a checkpoint holds rank 0's RNG state only).
        """
        sampler = getattr(batches, "sampler", None)
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        stream = (seed * 1_000_003 + epoch) * 1_009 + self.rank
        random.seed(stream)
        np.random.seed(stream % 2**32)
        torch.manual_seed(stream)

    def reduce_training(self, trained: Any) -> None:
        """The epoch's training loss sum and sample count over all ranks (train_loss is then the global mean)."""
        both = torch.stack([trained.loss_sum.double(), torch.tensor(float(trained.samples), dtype=torch.float64, device=trained.loss_sum.device)])
        dist.all_reduce(both)
        trained.loss_sum, trained.samples = both[0], int(both[1].item())

    def from_rank0(self, compute: Callable[[], T]) -> T:
        """Run `compute` on rank 0 only; every rank returns its (picklable) result."""
        box = [compute() if self.is_rank0 else None]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]
