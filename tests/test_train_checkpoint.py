"""Checkpoints: weights-only loadable, atomic, strict model-state loading; RNG capture; device/AMP choice."""

from __future__ import annotations

import dataclasses
import io
import os
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train import DataSplits, TrainConfig, fit, load_checkpoint, load_model_state
from hpolab.train import checkpoint as ckpt_mod
from hpolab.train.checkpoint import CHECKPOINT_FORMAT, StateDictMismatchError, save_checkpoint
from hpolab.train.device import resolve_amp, resolve_device
from hpolab.train.seeding import capture_rng_state, make_generator, restore_rng_state


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # (conftest: tiny models, one intra-op thread)

FIT_KEYS = {"format_version", "epoch", "history", "metric", "direction", "best_value", "best_epoch", "epoch_base", "config", "state"}
FIT_STATE_KEYS = {"model", "optimizer", "scheduler", "scaler", "global_step", "micro_step", "early_stopping", "rng", "amp", "device",
                  "torch_version"}


def tiny_data() -> DataSplits:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(48, 4, generator=g), torch.randint(0, 3, (48,), generator=g))
    return DataSplits(ds, ds, ds, num_classes=3, input_shape=(4,))


def test_fit_checkpoints_load_weights_only(tmp_path):
    config = TrainConfig(max_epochs=2, batch_size=16, optimizer="adamw", scheduler="plateau", warmup_epochs=0.5, device="cpu", tags={"who": "test"})
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    result = fit(config, model, tiny_data(), checkpoint_dir=tmp_path)
    assert result.last_checkpoint == tmp_path / "last.pt" and result.best_checkpoint == tmp_path / "best.pt"
    for name in ("last.pt", "best.pt"):
        state = torch.load(tmp_path / name, map_location="cpu", weights_only=True)
        assert set(state) == FIT_KEYS and set(state["state"]) == FIT_STATE_KEYS
    ckpt = load_checkpoint(tmp_path / "last.pt")
    assert ckpt["epoch"] == 2 and ckpt["config"] == {"trainer": dataclasses.asdict(config)}
    assert ckpt["history"] == result.history
    state = ckpt["state"]
    assert set(state["rng"]) == {"python", "numpy", "torch", "cuda", "generator"}
    assert not any(k.startswith("_orig_mod.") for k in state["model"])
    fresh = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    load_model_state(fresh, state["model"])
    for a, b in zip(fresh.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left


def _write_three_epochs(directory, values=(0.5, 0.9, 0.7)):
    """write_checkpoints (the routine's) after epochs 1-3 with these val_acc values (maximized), the
    model's weight set to the epoch number; returns last.pt's inode after each epoch."""
    from hpolab.train.optim import optimizer_from_config, schedule_from_config
    from hpolab.train.state import Checkpointed, LoopState, write_checkpoints

    cfg = TrainConfig(max_epochs=3, device="cpu")
    model = nn.Linear(4, 3)
    optimizer = optimizer_from_config(cfg, model)
    parts = Checkpointed(model, optimizer, schedule_from_config(cfg, optimizer, steps_per_epoch=1, direction="maximize"),
                         torch.amp.GradScaler("cpu", enabled=False), torch.Generator().manual_seed(0))
    state, inodes = LoopState(), {}
    for epoch, value in enumerate(values, 1):
        with torch.no_grad():
            model.weight.fill_(epoch)
        improved = state.record(epoch, {"val_acc": value}, value, "maximize", 0.0)
        last, best = write_checkpoints(state, parts, directory, improved=improved, cfg=cfg, metric="val_acc",
                                       direction="maximize", amp="off", device=torch.device("cpu"))
        assert (best is not None) == improved
        inodes[epoch] = last.stat().st_ino
    return inodes


def test_best_pt_is_the_best_epochs_last_pt_under_a_second_name(tmp_path):
    """Epoch 2 the best of 3: best.pt is epoch 2's last.pt file (a hard link: one write and fsync for
    both) and keeps epoch 2's state after epoch 3 writes a new last.pt."""
    inodes = _write_three_epochs(tmp_path)
    best, last = load_checkpoint(tmp_path / "best.pt"), load_checkpoint(tmp_path / "last.pt")
    assert (best["epoch"], best["best_epoch"]) == (2, 2) and torch.equal(best["state"]["model"]["weight"], torch.full((3, 4), 2.0))
    assert last["epoch"] == 3 and torch.equal(last["state"]["model"]["weight"], torch.full((3, 4), 3.0))
    assert (tmp_path / "best.pt").stat().st_ino == inodes[2] != (tmp_path / "last.pt").stat().st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]  # no link name left


def test_best_pt_is_written_out_where_hard_links_fail(tmp_path, monkeypatch):
    def no_links(src, dst, **kwargs):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(ckpt_mod.os, "link", no_links)  # (a filesystem without hard links)
    _write_three_epochs(tmp_path)
    best = load_checkpoint(tmp_path / "best.pt")
    assert best["epoch"] == 2 and torch.equal(best["state"]["model"]["weight"], torch.full((3, 4), 2.0))
    assert not os.path.samefile(tmp_path / "best.pt", tmp_path / "last.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]


def test_fit_keeps_the_best_epochs_last_pt_as_best_pt(tmp_path):
    """The routine end to end: best.pt is the last.pt file of fit's best epoch (val_loss maximized:
    most likely epoch 1, so later epochs write last.pt anew while best.pt stays)."""
    inodes = {}

    def on_epoch(epoch, metrics):
        inodes[epoch] = (tmp_path / "last.pt").stat().st_ino
        return False

    config = TrainConfig(max_epochs=3, batch_size=16, device="cpu")
    result = fit(config, nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3)), tiny_data(), metric="val_loss",
                 direction="maximize", on_epoch=on_epoch, checkpoint_dir=tmp_path)
    assert load_checkpoint(tmp_path / "best.pt")["epoch"] == result.best_epoch
    assert (tmp_path / "best.pt").stat().st_ino == inodes[result.best_epoch]


def test_failed_serialization_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint({"epoch": 1, "w": torch.ones(3)}, path)
    real_save = torch.save

    def half_written(obj, f, *args, **kwargs):
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", half_written)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint({"epoch": 2, "w": torch.zeros(3)}, path)
    assert load_checkpoint(path)["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_crash_while_writing_the_file_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint({"epoch": 1}, path)

    def crash(fd):
        raise OSError("power cut before the data reached the disk")

    monkeypatch.setattr(ckpt_mod.os, "fsync", crash)  # after the bytes are written, before the rename
    with pytest.raises(OSError, match="power cut"):
        save_checkpoint({"epoch": 2, "big": torch.zeros(10_000)}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    save_checkpoint({"epoch": 2}, path)  # and the next write goes through
    assert load_checkpoint(path)["epoch"] == 2


def test_a_pickled_object_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        torch.save({"model": nn.Linear(2, 2)}, f)  # a whole module: code, not data
    with pytest.raises(Exception, match="weights_only|Weights only"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_load_model_state_reports_missing_and_unexpected_keys():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    other = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    with pytest.raises(StateDictMismatchError) as info:
        load_model_state(model, other.state_dict())
    assert info.value.missing == ["1.bias", "1.weight"] and info.value.unexpected == ["2.bias", "2.weight"]
    assert "missing keys (2): 1.bias, 1.weight" in str(info.value) and "unexpected keys (2)" in str(info.value)
    wrong_shape = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2))
    with pytest.raises(StateDictMismatchError, match="size mismatch"):
        load_model_state(model, wrong_shape.state_dict())


def test_load_model_state_accepts_compiled_prefix():
    source = nn.Linear(2, 2)
    prefixed = {f"_orig_mod.{k}": v for k, v in source.state_dict().items()}  # as torch.compile saves
    target = nn.Linear(2, 2)
    load_model_state(target, prefixed)
    assert torch.equal(target.weight, source.weight)

    class FakeCompiled(nn.Module):  # what OptimizedModule looks like: the real module in _orig_mod
        def __init__(self, inner):
            super().__init__()
            self._orig_mod = inner

    wrapped = FakeCompiled(nn.Linear(2, 2))
    load_model_state(wrapped, source.state_dict())
    assert torch.equal(wrapped._orig_mod.weight, source.weight)


# ---------------------------------------------------------------- RNG state


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    gen = make_generator(3)
    random.random(), np.random.rand(), torch.rand(1), np.random.randn()  # leave a cached gaussian
    save_checkpoint({"rng": capture_rng_state(gen)}, tmp_path / "rng.pt")
    expected = (random.random(), float(np.random.randn()), torch.rand(3), torch.randperm(10, generator=gen))
    random.seed(99), np.random.seed(99), torch.manual_seed(99), gen.manual_seed(99)
    restore_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"], gen)
    got = (random.random(), float(np.random.randn()), torch.rand(3), torch.randperm(10, generator=gen))
    assert got[0] == expected[0] and got[1] == expected[1]
    assert torch.equal(got[2], expected[2]) and torch.equal(got[3], expected[3])


# ---------------------------------------------------------------- device and AMP


def test_amp_resolution(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_amp("auto", cpu) == "off"
    assert resolve_amp("bf16", cpu) == "bf16"
    assert resolve_amp("off", cuda) == "off"
    with pytest.raises(ValueError, match="needs CUDA"):
        resolve_amp("fp16", cpu)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_amp("auto", cuda) == "bf16" and resolve_amp("fp16", cuda) == "fp16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert resolve_amp("auto", cuda) == "fp16"  # emulated bf16 is slower than fp16: auto picks fp16


def test_device_resolution(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="device='auto' or 'cpu'"):
        resolve_device("cuda")


def test_a_checkpoint_of_the_earlier_layouts_is_read_as_the_one_layout_and_resumes(tmp_path):
    """A study paused or interrupted before an upgrade resumes: fit's format 1 (its state at the top,
    config the trainer's) and an own loop's ("own_loop": 1) are read as format 2."""
    config = TrainConfig(max_epochs=3, batch_size=16, device="cpu")
    fit(config, nn.Linear(4, 3), tiny_data(), checkpoint_dir=tmp_path / "new", on_epoch=lambda e, m: e >= 2)
    new = load_checkpoint(tmp_path / "new" / "last.pt")
    old = {**{k: v for k, v in new.items() if k not in ("state", "epoch_base", "config")}, **new["state"],
           "format_version": 1, "config": new["config"]["trainer"]}
    save_checkpoint(old, tmp_path / "old.pt")
    read = load_checkpoint(tmp_path / "old.pt")
    assert read["format_version"] == CHECKPOINT_FORMAT and read["config"] == new["config"] and set(read["state"]) == FIT_STATE_KEYS
    resumed = fit(config, nn.Linear(4, 3), tiny_data(), checkpoint_dir=tmp_path / "resumed", resume_from=tmp_path / "old.pt")
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3]

    own = {"own_loop": 1, "epoch": 2, "history": [{"epoch": 1, "val_acc": 0.5}, {"epoch": 2, "val_acc": 0.6}],
           "state": {"w": torch.ones(1)}, "metric": "val_acc", "direction": "maximize", "best_value": 0.6, "best_epoch": 2,
           "epoch_base": 0, "config": {"trainer": {"lr": 0.1}}}
    save_checkpoint(own, tmp_path / "own.pt")
    read = load_checkpoint(tmp_path / "own.pt")
    assert read["format_version"] == CHECKPOINT_FORMAT and "own_loop" not in read and torch.equal(read["state"]["w"], torch.ones(1))
    assert read["epoch_base"] == 0 and read["history"] == own["history"]
