"""Class-imbalance losses: inverse-frequency weights and focal loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hpolab.train.losses import FocalLoss, build_train_loss, inverse_frequency_weights


def test_inverse_frequency_weights_have_mean_one_and_favour_rare_classes():
    labels = torch.tensor([0] * 60 + [1] * 30 + [2] * 10)
    w = inverse_frequency_weights(labels, num_classes=4)  # class 3 never occurs
    assert w[3] == 0
    assert w[:3].mean() == pytest.approx(1.0)
    assert w[2] / w[0] == pytest.approx(6.0) and w[1] / w[0] == pytest.approx(2.0)


def test_focal_loss_reduces_to_cross_entropy_at_gamma_zero():
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(32, 5, generator=g), torch.randint(0, 5, (32,), generator=g)
    weight = torch.rand(5, generator=g) + 0.5
    assert FocalLoss(0.0)(logits, target) == pytest.approx(F.cross_entropy(logits, target).item(), rel=1e-5)
    assert FocalLoss(0.0, weight)(logits, target) == pytest.approx(F.cross_entropy(logits, target, weight=weight).item(), rel=1e-5)
    smoothed = F.cross_entropy(logits, target, label_smoothing=0.2).item()
    assert FocalLoss(0.0, label_smoothing=0.2)(logits, target) == pytest.approx(smoothed, rel=1e-5)


def test_focal_loss_down_weights_easy_examples():
    target = torch.tensor([0, 0])
    logits = torch.tensor([[4.0, 0.0], [0.5, 0.0]])  # easy, hard
    per_ce = F.cross_entropy(logits, target, reduction="none")
    easy = FocalLoss(2.0)(logits[:1], target[:1]) / per_ce[0]
    hard = FocalLoss(2.0)(logits[1:], target[1:]) / per_ce[1]
    assert easy < 0.01 < hard < 1


def test_build_train_loss_choices():
    labels = torch.tensor([0, 0, 0, 1])
    plain = build_train_loss(class_weighting="none", focal_gamma=0.0, label_smoothing=0.1, train_labels=None, num_classes=2)
    assert isinstance(plain, torch.nn.CrossEntropyLoss) and plain.weight is None and plain.label_smoothing == 0.1
    weighted = build_train_loss(class_weighting="inverse_freq", focal_gamma=0.0, label_smoothing=0.0, train_labels=labels, num_classes=2)
    assert torch.allclose(weighted.weight, torch.tensor([0.5, 1.5]))
    focal = build_train_loss(class_weighting="inverse_freq", focal_gamma=2.0, label_smoothing=0.0, train_labels=labels, num_classes=2)
    assert isinstance(focal, FocalLoss) and torch.allclose(focal.weight, torch.tensor([0.5, 1.5]))
