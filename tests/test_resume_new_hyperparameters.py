"""Resuming with new optimizer settings (what PBT's explore does): the optimizer's moments are kept, its
param groups take the new values, and the LR schedule continues from the new LR."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train import DataSplits, TrainConfig, fit, load_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # (conftest: tiny models, one intra-op thread)


def tiny_data() -> DataSplits:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g))
    return DataSplits(ds, ds, ds, num_classes=3, input_shape=(4,))


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def lrs_per_epoch(cfg: TrainConfig, directory, resume_from=None) -> dict[int, float]:
    seen: dict[int, float] = {}
    fit(cfg, model(), tiny_data(), checkpoint_dir=directory, resume_from=resume_from, on_epoch=lambda e, m: seen.__setitem__(e, m["lr"]) and False)
    return seen


@pytest.mark.parametrize(
    "base, changes",
    [
        (dict(optimizer="adamw", scheduler="cosine"), dict(lr=0.02, weight_decay=0.05, betas=(0.8, 0.99))),
        (dict(optimizer="sgd", scheduler="step", step_size=1, gamma=0.5), dict(lr=0.005, momentum=0.5, weight_decay=0.001)),
        (dict(optimizer="adam", scheduler="onecycle"), dict(lr=0.03)),
        (dict(optimizer="adamw", scheduler="none", warmup_epochs=1.0), dict(lr=0.004)),
    ],
)
def test_a_resume_with_new_optimizer_settings_keeps_the_moments_and_follows_the_new_values(tmp_path, base, changes):
    old = TrainConfig(max_epochs=4, batch_size=16, lr=0.01, device="cpu", **base)
    new = dataclasses.replace(old, **changes)
    lrs_per_epoch(old, tmp_path / "a")  # epochs 1..4 with the old settings, checkpoints in a/
    stopped = {}
    fit(old, model(), tiny_data(), checkpoint_dir=tmp_path / "b", on_epoch=lambda e, m: stopped.setdefault(e, True))  # stops after epoch 1
    steps_per_epoch = load_checkpoint(tmp_path / "b" / "last.pt")["state"]["global_step"]
    resumed = lrs_per_epoch(new, tmp_path / "b", resume_from=tmp_path / "b" / "last.pt")
    # Where the schedule of the new config would be at each epoch had it run from the start:
    fresh = lrs_per_epoch(new, tmp_path / "c")
    assert sorted(resumed) == [2, 3, 4]
    for epoch in (2, 3, 4):
        assert math.isclose(resumed[epoch], fresh[epoch], rel_tol=1e-6), (epoch, resumed, fresh)

    saved = load_checkpoint(tmp_path / "b" / "last.pt")["state"]
    groups = {g["name"]: g for g in saved["optimizer"]["param_groups"]}
    assert groups["decay"]["weight_decay"] == new.weight_decay and groups["no_decay"]["weight_decay"] == 0.0
    for group in groups.values():
        if new.optimizer == "sgd":
            assert group["momentum"] == new.momentum
        else:
            assert tuple(group["betas"]) == tuple(new.betas)
        if "initial_lr" in group and new.scheduler != "onecycle":
            assert group["initial_lr"] == new.lr
    # The moments carried over: their step count is that of four epochs, not of the three resumed ones.
    for param_state in saved["optimizer"]["state"].values():
        if "step" in param_state:
            assert int(param_state["step"]) == 4 * steps_per_epoch
        if "momentum_buffer" in param_state:
            assert param_state["momentum_buffer"] is not None


def test_a_resume_with_the_same_settings_changes_nothing(tmp_path):
    cfg = TrainConfig(max_epochs=3, batch_size=16, lr=0.01, device="cpu", scheduler="cosine")
    straight = lrs_per_epoch(cfg, tmp_path / "a")
    fit(cfg, model(), tiny_data(), checkpoint_dir=tmp_path / "b", on_epoch=lambda e, m: True)
    resumed = lrs_per_epoch(cfg, tmp_path / "b", resume_from=tmp_path / "b" / "last.pt")
    assert resumed == {2: straight[2], 3: straight[3]}
