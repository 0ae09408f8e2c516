"""Evaluation of a classifier on a split: plain cross-entropy, accuracy, macro-F1, per-class recall."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from .batches import Batches, eval_batches, to_device
from .device import autocast, resolve_amp, resolve_device
from .metrics import classification_stats


def evaluate_batches(
    model: nn.Module, batches: Batches, *, num_classes: int, device: torch.device, amp: str, channels_last: bool = False
) -> dict[str, Any]:
    """Loss (plain cross-entropy), accuracy, macro-F1, per-class recall. eval mode + inference_mode."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    all_preds, all_labels = [], []
    try:
        with torch.inference_mode(), autocast(device, amp):
            for x, y in batches:
                x, y = to_device(x, y, device, channels_last)
                logits = model(x).float()
                loss_sum += F.cross_entropy(logits, y, reduction="sum")
                all_preds.append(logits.argmax(dim=1))
                all_labels.append(y)
    finally:
        model.train(was_training)  # restore, so evaluation can be called from anywhere
    if not all_labels:
        raise ValueError("cannot evaluate an empty split")
    labels = torch.cat(all_labels).cpu()  # one device sync per evaluation
    preds = torch.cat(all_preds).cpu()
    stats = classification_stats(labels, preds, num_classes)
    stats["loss"] = float(loss_sum) / labels.numel()
    stats["n"] = int(labels.numel())
    return stats


def evaluate(
    model: nn.Module,
    dataset: Dataset,
    *,
    num_classes: int,
    device: str | torch.device = "cpu",
    batch_size: int = 512,
    amp: str = "off",
) -> dict[str, Any]:
    """Evaluate a classifier on a split (e.g. the held-out test split).

    Returns {"loss": mean cross-entropy, "acc", "macro_f1", "recall": per-class list (nan for a
    class absent from the split), "n": samples}. The model is moved to `device` ("auto", "cpu",
    "cuda", "cuda:1", ...); its train/eval mode is restored afterwards.
    """
    if isinstance(device, str) and device in ("auto", "cpu", "cuda"):
        dev = resolve_device(device)
    else:
        dev = torch.device(device)
    resolved_amp = resolve_amp(amp, dev)
    model.to(dev)
    batches = eval_batches(dataset, batch_size, dev)
    return evaluate_batches(model, batches, num_classes=num_classes, device=dev, amp=resolved_amp)
