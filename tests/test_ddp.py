"""Multi-device trials (trainer.devices > 1): DDP on the CPU with gloo and 2 processes.

fit() level: 2 ranks train on the same effective batch as one process and reach the same
validation metrics; through the real CLI: a pruned DDP trial is PRUNED with the right epochs and
leaves no process behind, and a COMPLETE one logs its model like a single-device trial.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train import DataSplits, TrainConfig, fit, seed_everything
from hpolab.train.distributed import close_ranks, init_ranks

EPOCHS = 4


def _data(n_train: int = 256, n_val: int = 128) -> DataSplits:
    g = torch.Generator().manual_seed(123)
    w = torch.randn(10, 3, generator=g)

    def split(n):
        x = torch.randn(n, 10, generator=g)
        return TensorDataset(x, (x @ w).argmax(1))

    return DataSplits(train=split(n_train), val=split(n_val), test=split(64), num_classes=3, input_shape=(10,))


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))


def _cfg(devices: int, **kw) -> TrainConfig:
    base = dict(max_epochs=EPOCHS, batch_size=32, lr=3e-2, device="cpu", amp="off", devices=devices, scheduler="cosine")
    return TrainConfig(**{**base, **kw})


def _fit(cfg: TrainConfig, ranks=None, on_epoch=None, checkpoint_dir=None):
    seed_everything(0)
    model = _model()
    return fit(cfg, model, _data(), metric="val_acc", direction="maximize", seed=0, ranks=ranks,
               on_epoch=on_epoch, checkpoint_dir=checkpoint_dir)


def _rank(rank: int, world: int, port: int, kw: dict, out, stop_after: int | None, ckpt: str | None) -> None:
    torch.set_num_threads(1)
    ranks = init_ranks(rank, world, host="127.0.0.1", port=port, device=torch.device("cpu"), timeout_s=120)
    seen = []

    def on_epoch(epoch, metrics):
        seen.append(epoch)
        return stop_after is not None and epoch >= stop_after

    result = _fit(_cfg(world, **kw), ranks, on_epoch=on_epoch, checkpoint_dir=ckpt if rank == 0 else None)
    close_ranks()
    out.send((rank, result.history, result.stop_reason, seen))
    out.close()


def _fit_ranks(world: int, stop_after: int | None = None, ckpt: str | None = None, **kw):
    """fit() on `world` forked CPU ranks (gloo); [(rank, history, stop_reason, epochs on_epoch saw)] by rank."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=timedelta(seconds=120), wait_for_workers=False)
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in range(world)]
    procs = [ctx.Process(target=_rank, args=(r, world, store.port, kw, pipes[r][1], stop_after, ckpt)) for r in range(world)]
    for p in procs:
        p.start()
    results = [pipes[r][0].recv() for r in range(world)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return sorted(results, key=lambda r: r[0])


@pytest.mark.parametrize("accum", [1, 2])
def test_two_ranks_match_one_process(accum):
    single = _fit(_cfg(1, grad_accum_steps=accum))
    results = _fit_ranks(2, grad_accum_steps=accum)
    (_, h0, reason0, seen0), (_, h1, reason1, seen1) = results
    assert reason0 == reason1 == "max_epochs"
    assert seen0 == list(range(1, EPOCHS + 1)) and seen1 == []  # only rank 0 calls on_epoch
    # Every rank holds the same metrics (rank 0 evaluated and broadcast them).
    timing = ("epoch_seconds", "samples_per_second", "data_wait_fraction")  # each rank's own clock
    for a, b in zip(h0, h1):
        assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
    # Same effective batch, same samples per step: the same run as one process up to float summation order.
    for one, two in zip(single.history, h0):
        for key in ("train_loss", "val_loss", "val_acc", "lr", "grad_norm"):
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-5), (one["epoch"], key, one[key], two[key])
    print("devices=1 vs 2 after", EPOCHS, "epochs:", single.history[-1]["val_acc"], h0[-1]["val_acc"],
          "val_loss diff", abs(single.history[-1]["val_loss"] - h0[-1]["val_loss"]))


def test_rank0_stop_stops_every_rank_and_only_rank0_writes(tmp_path):
    results = _fit_ranks(2, stop_after=2, ckpt=str(tmp_path))
    for rank, history, reason, _ in results:
        assert reason == "stopped_by_caller" and [h["epoch"] for h in history] == [1, 2], rank
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]


def test_batch_size_must_divide_by_devices():
    with pytest.raises(ValueError, match="divisible by devices"):
        TrainConfig(batch_size=33, devices=2)
