"""Checkpoints: weights-only loadable, atomic, strict model-state loading; RNG capture; device/AMP choice."""

from __future__ import annotations

import dataclasses
import io
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train import DataSplits, TrainConfig, fit, load_checkpoint, load_model_state
from hpolab.train import checkpoint as ckpt_mod
from hpolab.train.checkpoint import StateDictMismatchError, save_checkpoint
from hpolab.train.device import resolve_amp, resolve_device
from hpolab.train.seeding import capture_rng_state, make_generator, restore_rng_state


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # (conftest: tiny models, one intra-op thread)

FIT_KEYS = {
    "format_version", "epoch", "global_step", "micro_step", "model", "optimizer", "scheduler", "scaler",
    "metric", "direction", "best_value", "best_epoch", "early_stopping", "rng", "config", "history",
    "amp", "device", "torch_version",
}


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
        assert set(state) == FIT_KEYS
    state = load_checkpoint(tmp_path / "last.pt")
    assert state["epoch"] == 2 and state["config"] == dataclasses.asdict(config)
    assert state["history"] == result.history
    assert set(state["rng"]) == {"python", "numpy", "torch", "cuda", "generator"}
    assert not any(k.startswith("_orig_mod.") for k in state["model"])
    fresh = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    load_model_state(fresh, state["model"])
    for a, b in zip(fresh.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left


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
