"""Optimizer parameter groups, the registration checks, and the LR schedules (no training needed)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train import DataSplits, TrainConfig, fit
from hpolab.train.optim import (
    LRSchedule,
    build_optimizer,
    check_optimizer_covers,
    check_trainable_parameters,
    find_unregistered_parameters,
    param_groups,
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # (conftest: tiny models, one intra-op thread)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.ln = nn.LayerNorm(4)
        self.fc = nn.Linear(4, 2)
        self.scale = nn.Parameter(torch.ones(()))  # 0-d: no decay either
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)


def test_weight_decay_excludes_biases_and_norm_weights():
    model = ConvNet()
    groups = {g["name"]: g for g in param_groups(model, weight_decay=0.1)}
    decay = {id(p) for p in groups["decay"]["params"]}
    no_decay = {id(p) for p in groups["no_decay"]["params"]}
    assert decay == {id(model.conv.weight), id(model.fc.weight)}
    assert no_decay == {id(p) for p in (model.conv.bias, model.bn.weight, model.bn.bias, model.ln.weight, model.ln.bias, model.fc.bias, model.scale)}
    assert groups["decay"]["weight_decay"] == 0.1 and groups["no_decay"]["weight_decay"] == 0.0
    assert id(model.frozen.weight) not in decay | no_decay  # frozen parameters stay out
    opt = build_optimizer("adamw", param_groups(model, 0.1), lr=1e-3)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    check_optimizer_covers(model, opt)


def test_optimizer_kinds():
    model = nn.Linear(2, 2)
    assert isinstance(build_optimizer("adam", param_groups(model, 0.0), lr=1e-3), torch.optim.Adam)
    sgd = build_optimizer("sgd", param_groups(model, 0.0), lr=0.1, momentum=0.8, nesterov=True)
    assert sgd.defaults["momentum"] == 0.8 and sgd.defaults["nesterov"]
    with pytest.raises(ValueError, match="momentum > 0"):
        build_optimizer("sgd", param_groups(model, 0.0), lr=0.1, momentum=0.0, nesterov=True)


class ListOfLayers(nn.Module):
    """The classic bug: layers in a python list are invisible to .parameters()."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 2)
        self.blocks = [nn.Linear(4, 4), nn.Linear(4, 4)]

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class FixedListOfLayers(ListOfLayers):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(self.blocks)


class SharedReference(nn.Module):
    """A python list of *registered* modules (e.g. for iteration order) is fine."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)
        self.order = [self.b, self.a]


class TensorAttribute(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.gain = torch.ones(2, requires_grad=True)  # should have been nn.Parameter


def test_unregistered_parameters_are_found():
    assert find_unregistered_parameters(ListOfLayers()) == ["blocks"]
    assert find_unregistered_parameters(nn.Sequential(ListOfLayers())) == ["0.blocks"]
    assert find_unregistered_parameters(TensorAttribute()) == ["gain"]
    assert find_unregistered_parameters(FixedListOfLayers()) == []
    assert find_unregistered_parameters(SharedReference()) == []
    frozen_teacher = FixedListOfLayers()
    frozen_teacher.teacher = [nn.Linear(4, 4).requires_grad_(False)]  # deliberately hidden and frozen
    assert find_unregistered_parameters(frozen_teacher) == []
    with pytest.raises(ValueError, match=r"blocks.*nn\.ModuleList"):
        check_trainable_parameters(ListOfLayers())
    with pytest.raises(ValueError, match="no trainable parameters"):
        check_trainable_parameters(nn.ReLU())


def test_fit_refuses_a_model_with_a_list_of_layers():
    ds = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    data = DataSplits(ds, ds, ds, num_classes=2, input_shape=(4,))
    with pytest.raises(ValueError, match="not registered"):
        fit(TrainConfig(max_epochs=1, device="cpu"), ListOfLayers(), data)


def test_optimizer_missing_a_parameter_is_caught():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"1\.weight, 1\.bias"):
        check_optimizer_covers(model, opt)


# ---------------------------------------------------------------- schedules


def run_schedule(kind: str, *, steps_per_epoch=10, max_epochs=5, metric=lambda epoch: 0.5, **kw) -> list[list[float]]:
    """LR used by each optimizer step, grouped per epoch."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = LRSchedule(kind, opt, lr=1.0, steps_per_epoch=steps_per_epoch, max_epochs=max_epochs, **kw)
    epochs = []
    for epoch in range(max_epochs):
        lrs = []
        for _ in range(steps_per_epoch):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            schedule.after_optimizer_step()
        schedule.after_epoch(metric(epoch))
        epochs.append(lrs)
    return epochs


def flat(epochs):
    return [lr for e in epochs for lr in e]


def test_onecycle_rises_to_max_then_anneals():
    lrs = flat(run_schedule("onecycle"))
    peak = lrs.index(max(lrs))
    assert lrs[0] == pytest.approx(1.0 / 25)  # torch's div_factor
    assert max(lrs) == pytest.approx(1.0) and 10 <= peak <= 20  # ~30% of 50 steps
    assert all(a <= b for a, b in zip(lrs[:peak], lrs[1 : peak + 1]))
    assert lrs[-1] < 1e-3


def test_cosine_per_step_to_min_lr():
    lrs = flat(run_schedule("cosine", min_lr=0.1))
    assert lrs[0] == 1.0
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert len(set(lrs[:10])) == 10  # changes within an epoch: per step
    assert lrs[-1] == pytest.approx(0.1, abs=2e-3)
    assert lrs[25] == pytest.approx(0.1 + 0.9 * 0.5, abs=1e-9)  # half way


def test_warmup_starts_low_and_ramps_linearly():
    lrs = flat(run_schedule("cosine", warmup_epochs=1.0))
    assert lrs[0] == pytest.approx(0.01)
    assert lrs[5] == pytest.approx(0.01 + 0.99 * 0.5)
    assert lrs[10] == pytest.approx(1.0)  # warm-up over, cosine starts at the peak
    const = flat(run_schedule("none", warmup_epochs=0.5))
    assert const[0] == pytest.approx(0.01) and const[5:] == [1.0] * 45


def test_step_decays_every_step_size_epochs():
    epochs = run_schedule("step", step_size=2, gamma=0.5)
    assert [set(e) for e in epochs] == [{1.0}, {1.0}, {0.5}, {0.5}, {0.25}]


def test_plateau_reduces_on_the_metric():
    # A metric that stops improving after epoch 1 (maximize): patience 1 -> cut after 2 bad epochs.
    epochs = run_schedule("plateau", plateau_patience=1, gamma=0.1, metric=lambda e: [0.5, 0.9, 0.9, 0.9, 0.9][e])
    assert [e[0] for e in epochs] == pytest.approx([1.0, 1.0, 1.0, 1.0, 0.1])
    # direction matters: the same sequence while minimizing is bad from epoch 2 on
    epochs = run_schedule("plateau", plateau_patience=1, gamma=0.1, direction="minimize", metric=lambda e: [0.5, 0.9, 0.9, 0.9, 0.9][e])
    assert [e[0] for e in epochs] == pytest.approx([1.0, 1.0, 1.0, 0.1, 0.1])


def test_schedule_state_round_trips():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    a = LRSchedule("cosine", opt, lr=1.0, steps_per_epoch=4, max_epochs=3, warmup_epochs=1)
    for _ in range(5):
        opt.step()
        a.after_optimizer_step()
    opt2 = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    b = LRSchedule("cosine", opt2, lr=1.0, steps_per_epoch=4, max_epochs=3, warmup_epochs=1)
    opt2.load_state_dict(opt.state_dict())
    b.load_state_dict(a.state_dict())
    for _ in range(7):
        opt.step(), opt2.step()
        a.after_optimizer_step(), b.after_optimizer_step()
        assert opt.param_groups[0]["lr"] == opt2.param_groups[0]["lr"]
    with pytest.raises(ValueError, match="scheduler"):
        LRSchedule("step", opt2, lr=1.0, steps_per_epoch=4, max_epochs=3).load_state_dict(a.state_dict())


@pytest.mark.parametrize("kind", ["none", "cosine", "onecycle", "step", "plateau"])
def test_every_scheduler_runs_in_fit_and_logs_lr(kind):
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    data = DataSplits(ds, ds, ds, num_classes=2, input_shape=(4,))
    cfg = TrainConfig(max_epochs=4, batch_size=16, lr=0.1, scheduler=kind, step_size=1, gamma=0.5, plateau_patience=0, device="cpu")
    # val_loss maximized never improves while training lowers it: plateau must cut the LR.
    result = fit(cfg, nn.Linear(4, 2), data, metric="val_loss", direction="maximize")
    lrs = [h["lr"] for h in result.history]
    assert all(math.isfinite(lr) and lr >= 0 for lr in lrs)  # cosine ends at min_lr=0
    if kind == "none":
        assert lrs == [0.1] * 4
    else:
        assert lrs[-1] < 0.1 and len(set(lrs)) > 1
    if kind == "step":
        assert lrs == pytest.approx([0.05, 0.025, 0.0125, 0.00625])
