"""LR range test, the sweep (hpolab.train.lr_range_test): on a logistic regression with a known good
LR range, then the robustness cases (divergence, NaN, flat curve, too-early divergence) and the
bounds rule. Its outputs (CSV, PNG, MLflow, the child-process entry, the digits spec) are tested in
test_lr_range_outputs.py.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train.config import TrainConfig
from hpolab.train.data import DataSplits
from hpolab.train.lr_range_test import (
    DIVERGE_RUN,
    LRRangeResult,
    bounds_from_lr_range_test,
    find_divergence,
    lr_range_test,
    lr_schedule,
)
from test_train_loop import MapDataset  # a Dataset that is not a TensorDataset: the DataLoader path



@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny models: one intra-op thread is fastest, and keeps timings sane on a shared 2-core box.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------- a logistic regression with a known good LR range


def logistic_data(n: int = 1024, d: int = 10, label_noise: float = 0.05, seed: int = 0) -> DataSplits:
    """Two classes split by a random hyperplane (margin 0.3), 5% of the labels flipped.

    The flips matter: on perfectly separable data any huge LR "works" (the weights just grow and
    the loss goes to 0), so nothing would diverge. With flips the best achievable loss is ~0.24.
    """
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d, generator=g)
    w /= w.norm()
    x = torch.randn(n, d, generator=g)
    margin = x @ w
    keep = margin.abs() > 0.3
    x, margin = x[keep], margin[keep]
    y = (margin > 0).long()
    flip = torch.rand(len(y), generator=g) < label_noise
    y[flip] = 1 - y[flip]
    ds = TensorDataset(x, y)
    return DataSplits(train=ds, val=ds, test=ds, num_classes=2, input_shape=(d,))


SGD = TrainConfig(optimizer="sgd", momentum=0.0, weight_decay=0.0, batch_size=32, amp="off", device="cpu", scheduler="none")

# The good range for SGD (no momentum, batch 32) on logistic_data, measured by training at constant
# LRs for 2 epochs (48 steps, 3 seeds) and comparing the full-data loss with the best one (0.235):
#   lr    0.03  0.05  0.07  0.1   0.2   0.5   1     2     3     5
#   loss  +80%  +51%  +35%  +23%  +7%   +0%   +1%   +7%   +18%  +49%
# [0.1, 2] is where that loss is within ~25% of the best. It also matches theory: the loss is
# smooth with curvature <= ~0.5 * lambda_max(E[x x^T]) ~ 0.6 here, so plain gradient descent is
# stable below ~2 / 0.6 ~ 3, and LRs far below 0.1 barely move in 50 steps.
GOOD_LR_RANGE = (0.1, 2.0)


def logistic_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(10, 2)


def test_suggestion_lands_in_the_known_good_range():
    r = lr_range_test(SGD, logistic_model(), logistic_data(), min_lr=1e-4, max_lr=1e4, num_steps=100, seed=0)
    assert r.suggestion is not None, r.warning
    assert GOOD_LR_RANGE[0] <= r.suggestion <= GOOD_LR_RANGE[1], (r.suggestion, r.steepest_lr, r.valley_lr)
    # The rule chosen by bench/lr_rule.py (min_loss/10; it was "valley" until the benchmark showed
    # valley ~1.3 decades below the best LR of full trainings on all three experiments).
    assert r.suggestion == pytest.approx(r.min_loss_lr / 10) and r.suggestion_rule == "min_loss/10"
    assert r.warning is None
    # The other rules are reported too, all inside the sweep.
    for v in (r.steepest_lr, r.valley_lr, r.min_loss_lr):
        assert 1e-4 <= v <= 1e4
    # Curve bookkeeping: one entry per recorded step, the bias-corrected EMA starts at the first loss.
    assert len(r.lrs) == len(r.losses) == len(r.smoothed)
    assert r.smoothed[0] == pytest.approx(r.losses[0])
    assert all(math.isfinite(v) for v in r.losses + r.smoothed)
    assert r.lrs == lr_schedule(1e-4, 1e4, 100, "exp")[: len(r.lrs)]
    assert r.settings["optimizer"] == "sgd" and r.settings["effective_batch"] == 32


def test_divergence_stops_the_sweep_early():
    r = lr_range_test(SGD, logistic_model(), logistic_data(), min_lr=1e-2, max_lr=1e8, num_steps=100)
    assert r.stopped_early and len(r.lrs) < 100
    # The points up to the one that confirmed divergence are kept; the divergence point is where
    # the loss first went over (raw test: the first of DIVERGE_RUN high steps), within the last few.
    i = r.lrs.index(r.diverged_at_lr)
    assert len(r.lrs) - DIVERGE_RUN <= i <= len(r.lrs) - 1
    assert "exceeded" in r.reason
    assert 3.0 <= r.diverged_at_lr <= 100.0  # gradient descent on this loss is unstable above ~3 (see GOOD_LR_RANGE)
    assert r.suggestion is not None and r.suggestion < r.diverged_at_lr
    low, high = bounds_from_lr_range_test(r)
    assert high <= r.diverged_at_lr


# ---------------------------------------------------------------- divergence on synthetic curves (no training)


def _ema(losses, smoothing=0.05):
    out, avg = [], 0.0
    for i, v in enumerate(losses):
        avg = (1 - smoothing) * avg + smoothing * v
        out.append(avg / (1 - (1 - smoothing) ** (i + 1)))
    return np.array(out)


def _descent(n=80, start=2.3, end=0.25, noise=0.05, seed=0):
    """A loss falling geometrically from `start` to `end` over n steps, with 5% batch noise."""
    rng = np.random.default_rng(seed)
    return list(np.geomspace(start, end, n) * (1 + noise * rng.standard_normal(n)))


def test_raw_loss_explosion_is_divergence_even_when_the_smoothed_loss_has_not_caught_up():
    """The digits CNN's curve on main: raw loss 0.24 -> 7.7, smoothed never above 4 x its best."""
    lrs = lr_schedule(1e-7, 10.0, 100)
    losses = _descent() + [1.6, 7.7, 2.8, 2.2, 2.3, 2.0, 2.9, 4.1, 5.9, 3.3]  # explodes at step 80
    smoothed = _ema(losses)
    # the smoothed-only test would say "no divergence": after its minimum it stays below 4 x that
    assert smoothed[int(np.argmin(smoothed)) :].max() < 4 * smoothed.min()
    first, why = find_divergence(losses)
    assert first == 80 and lrs[first] == pytest.approx(lrs[80])  # where the raw loss went over
    assert "in a row" in why


def test_single_spikes_are_not_divergence():
    losses = _descent(100)
    for i in range(20, 100, 10):
        losses[i] *= 8  # one bad batch every 10 steps
    assert find_divergence(losses) is None


def test_a_creep_with_good_batches_in_between_is_caught_by_the_smoothed_loss():
    # Never DIVERGE_RUN high batches in a row, but the average climbs far above the best.
    losses = _descent() + [0.25, 5.0] * 20
    first, why = find_divergence(losses)
    assert first > 80 and why.startswith("smoothed loss")


def test_a_loss_near_zero_is_not_divergence_on_noise():
    """Separable data: the loss falls to ~1e-4; batches of 1e-3 (10x "best") are not an explosion ..."""
    losses = _descent(60, start=0.69, end=1e-4, noise=0.0) + [1e-3, 2e-3, 1e-3] * 10
    assert find_divergence(losses) is None
    # ... while going back towards the untrained loss is.
    first, _ = find_divergence(losses + [0.5, 0.7, 0.9, 1.2])
    assert first == 90


class NaNOnceLarge(nn.Module):
    """A linear model whose output turns NaN once a weight exceeds 100 (like an fp16 overflow would)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(10, 2)

    def forward(self, x):
        guard = torch.sqrt(100.0 - self.lin.weight.abs().max())  # NaN once the weights blow up
        return self.lin(x) + 0.0 * guard


def test_nan_loss_stops_the_sweep_and_is_not_recorded():
    r = lr_range_test(SGD, NaNOnceLarge(), logistic_data(), min_lr=1e-3, max_lr=1e6, num_steps=100, diverge_factor=1e300)
    assert r.stopped_early and len(r.lrs) < 100
    assert "nan" in r.reason
    assert r.diverged_at_lr is not None and r.diverged_at_lr > r.lrs[-1]  # the NaN step's LR, not recorded
    assert all(math.isfinite(v) for v in r.losses)


def test_divergence_right_away_gives_no_suggestion():
    r = lr_range_test(SGD, logistic_model(), logistic_data(), min_lr=1e3, max_lr=1e8, num_steps=100)
    assert r.stopped_early and len(r.lrs) < 10
    assert r.suggestion is None
    assert "lower min_lr" in r.warning.lower()
    with pytest.raises(ValueError, match="low/high"):
        bounds_from_lr_range_test(r)


class ZeroGradient(nn.Module):
    """Logits from a frozen random projection (+ 0 x a parameter): the loss cannot depend on the LR.

    noisy=True: the per-batch loss still varies (different batches), with no trend -- a pure-noise
    curve. noisy=False: constant logits, exactly the same loss every step.
    """

    def __init__(self, noisy: bool):
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("proj", torch.randn(10, 2) if noisy else torch.zeros(10, 2))
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return x @ self.proj + 0.0 * self.w


@pytest.mark.parametrize("noisy", [True, False])
def test_flat_curve_gives_a_warning_not_a_suggestion(noisy):
    for seed in (0, 1, 2):
        r = lr_range_test(SGD, ZeroGradient(noisy), logistic_data(), num_steps=100, seed=seed)
        assert not r.stopped_early and len(r.lrs) == 100
        assert r.suggestion is None, (seed, r.suggestion)
        assert r.warning and "flat" in r.warning


def test_linear_mode():
    cfg = dataclasses.replace(SGD, batch_size=64)
    r = lr_range_test(cfg, logistic_model(), logistic_data(), min_lr=1e-2, max_lr=5.0, num_steps=50, mode="linear")
    lrs = np.array(r.lrs)
    assert len(lrs) == 50 and lrs[0] == 1e-2 and lrs[-1] == 5.0
    np.testing.assert_allclose(np.diff(lrs), (5.0 - 1e-2) / 49)
    assert r.suggestion is not None and 1e-2 <= r.suggestion <= 5.0
    assert r.settings["mode"] == "linear"


def test_bf16_autocast_on_cpu():
    cfg = dataclasses.replace(SGD, amp="bf16")
    r = lr_range_test(cfg, logistic_model(), logistic_data(), min_lr=1e-4, max_lr=1e4, num_steps=60)
    assert r.settings["amp"] == "bf16"
    assert r.suggestion is not None and 1e-4 <= r.suggestion <= 1e4


def test_train_package_stays_free_of_platform_imports():
    """train/ runs on a bare torch box: no optuna, mlflow, pydantic or matplotlib in the sweep modules."""
    import ast

    import hpolab.train.lr_range_test as mod
    import hpolab.train.lr_suggest as suggest_mod
    import hpolab.train.lr_sweep as sweep_mod

    imported = set()
    for m in (mod, sweep_mod, suggest_mod):
        for node in ast.walk(ast.parse(Path(m.__file__).read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    assert not imported & {"optuna", "mlflow", "pydantic", "matplotlib", "hpolab"}, imported


def test_bad_arguments_are_rejected_together():
    with pytest.raises(ValueError) as e:
        lr_range_test(SGD, logistic_model(), logistic_data(), min_lr=1.0, max_lr=0.1, num_steps=2, mode="cos", smoothing=1.5)
    msg = str(e.value)
    for needle in ("min_lr < max_lr", "num_steps", "mode", "smoothing"):
        assert needle in msg


# ---------------------------------------------------------------- the caller's model, the trainer's settings


class Counted(nn.Module):
    """An MLP with BatchNorm (buffers), dropout and a frozen parameter."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))
        self.net[0].bias.requires_grad_(False)

    def forward(self, x):
        return self.net(x)


def test_callers_model_is_untouched_and_trainer_settings_are_used():
    model = Counted().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    ids = {n: id(p) for n, p in model.named_parameters()}
    batch_sizes: list[int] = []
    # Hooks travel with the deep copy: they count the micro-batches the sweep runs.
    model.register_forward_hook(lambda mod, inp, out: batch_sizes.append(len(inp[0])))

    cfg = TrainConfig(optimizer="adamw", weight_decay=0.1, batch_size=16, grad_accum_steps=3, grad_clip_norm=1.0,
                      label_smoothing=0.1, amp="off", device="cpu")
    r = lr_range_test(cfg, model, logistic_data(n=200), min_lr=1e-5, max_lr=1e-1, num_steps=20)

    assert len(r.lrs) == 20  # 20 optimizer steps ...
    assert batch_sizes == [16] * 60  # ... of 3 micro-batches of 16; 140 samples -> 8 batches/epoch: cycled
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k  # parameters and BatchNorm buffers, bit for bit
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert {n: id(p) for n, p in model.named_parameters()} == ids
    assert not model.training  # its mode is not changed either
    assert r.settings["effective_batch"] == 48 and r.settings["grad_accum_steps"] == 3


def test_dataloader_datasets_are_cycled():
    data = logistic_data(n=120)  # ~90 samples: 2 batches of 32 per pass (drop_last)
    data = dataclasses.replace(data, train=MapDataset(data.train))
    model = logistic_model()
    seen: list[int] = []
    model.register_forward_hook(lambda mod, inp, out: seen.append(len(inp[0])))
    r = lr_range_test(SGD, model, data, min_lr=1e-3, max_lr=1.0, num_steps=12)
    assert len(r.lrs) == 12 and seen == [32] * 12


# ---------------------------------------------------------------- bounds rule


def _result(suggestion, diverged=None) -> LRRangeResult:
    return LRRangeResult(
        lrs=[1e-3, 1e-2], losses=[1.0, 0.5], smoothed=[1.0, 0.7], suggestion=suggestion, steepest_lr=suggestion,
        valley_lr=suggestion, min_loss_lr=suggestion, diverged_at_lr=diverged, stopped_early=diverged is not None,
        reason="test",
    )


def test_bounds_rule():
    assert bounds_from_lr_range_test(_result(1e-2)) == pytest.approx((1e-3, 1e-1))  # no divergence: s/10, s*10
    assert bounds_from_lr_range_test(_result(1e-2, diverged=5e-2)) == pytest.approx((1e-3, 5e-2))  # capped
    assert bounds_from_lr_range_test(_result(1e-2, diverged=1.0)) == pytest.approx((1e-3, 1e-1))  # cap not binding
    low, high = bounds_from_lr_range_test(_result(1e-2, diverged=5e-4))  # pathological: keep low < high
    assert high == pytest.approx(5e-4) and low == pytest.approx(5e-5) and low < high
    with pytest.raises(ValueError, match="from_lr_range_test"):
        bounds_from_lr_range_test(_result(None))
