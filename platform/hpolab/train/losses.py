"""Training losses for classification, including the class-imbalance options.

- class_weighting="inverse_freq": per-class weights 1/count from the train labels, scaled to mean 1
  over the classes present (so the loss stays on the scale of the unweighted one and the LR needs no
  retuning); a class absent from the train split gets weight 0.
- focal_gamma > 0: focal loss (Lin et al. 2017), -(1 - p_t)^gamma * log p_t, down-weights easy
  examples; combines with the class weights and label smoothing.
Validation loss is always plain cross-entropy (see `evaluation.py`), so trials that differ in these
options remain comparable on val_loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def inverse_frequency_weights(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per-class weights proportional to 1/count, mean 1 over the classes that occur."""
    counts = torch.bincount(labels.long().cpu(), minlength=num_classes)[:num_classes].double()
    present = counts > 0
    weights = torch.zeros(num_classes, dtype=torch.float64)
    weights[present] = 1.0 / counts[present]
    weights[present] /= weights[present].mean()
    return weights.float()


class FocalLoss(nn.Module):
    """Multi-class focal loss with optional class weights and label smoothing.

    Reduction mirrors nn.CrossEntropyLoss: a weighted mean, normalized by the sum of the target
    classes' weights.
    """

    def __init__(self, gamma: float, weight: torch.Tensor | None = None, label_smoothing: float = 0.0):
        super().__init__()
        self.gamma = float(gamma)
        self.label_smoothing = float(label_smoothing)
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # Always in fp32: (1 - p)^gamma of a bf16 probability near 1 is mostly rounding error.
        log_probs = F.log_softmax(logits.float(), dim=-1)
        log_pt = log_probs.gather(1, target[:, None]).squeeze(1)
        nll = -log_pt
        if self.label_smoothing > 0:
            nll = (1 - self.label_smoothing) * nll - self.label_smoothing * log_probs.mean(dim=-1)
        focal = (1 - log_pt.exp()).clamp(min=0) ** self.gamma
        per_sample = focal * nll
        if self.weight is None:
            return per_sample.mean()
        w = self.weight[target]
        return (w * per_sample).sum() / w.sum()


def build_train_loss(
    *,
    class_weighting: str,
    focal_gamma: float,
    label_smoothing: float,
    train_labels: torch.Tensor | None,
    num_classes: int,
) -> nn.Module:
    """The criterion the optimizer minimizes. `train_labels` is needed for inverse_freq only."""
    weight = None
    if class_weighting == "inverse_freq":
        if train_labels is None:
            raise ValueError("class_weighting='inverse_freq' needs the train labels")
        weight = inverse_frequency_weights(train_labels, num_classes)
    elif class_weighting != "none":
        raise ValueError(f"class_weighting must be 'none' or 'inverse_freq', got {class_weighting!r}")
    if focal_gamma > 0:
        return FocalLoss(focal_gamma, weight=weight, label_smoothing=label_smoothing)
    return nn.CrossEntropyLoss(weight=weight, label_smoothing=label_smoothing)


def criterion_from_config(cfg, data, device) -> nn.Module:
    """The trainer's training loss for `data` (class weights from the train labels when asked)."""
    from .data import labels_of

    return build_train_loss(
        class_weighting=cfg.class_weighting,
        focal_gamma=cfg.focal_gamma,
        label_smoothing=cfg.label_smoothing,
        train_labels=labels_of(data.train) if cfg.class_weighting != "none" else None,
        num_classes=data.num_classes,
    ).to(device)
