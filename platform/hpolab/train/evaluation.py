"""Evaluation of a model on a split: the task's validation loss and its metrics over the whole split
(classification: plain cross-entropy, accuracy, macro-F1, per-class recall)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from .batches import Batches, eval_batches, to_device
from .device import autocast, resolve_amp, resolve_device
from .tasks import Classification


def evaluate_batches(
    model: nn.Module, batches: Batches, *, num_classes: int, device: torch.device, amp: str, channels_last: bool = False,
    bound: Any = None,
) -> dict[str, Any]:
    """The task's metrics over the split, plus "loss" (the task's validation loss, a mean over samples) and
    "n". eval mode + inference_mode. `bound`: the task bound to the data (train/tasks/); classification when None."""
    if bound is None:
        bound = Classification().unbound(num_classes)
    target_dtype = bound.task.target_dtype
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    kept, targets = [], []
    try:
        with torch.inference_mode(), autocast(device, amp):
            for x, y in batches:
                x, y = to_device(x, y, device, channels_last, target_dtype)
                outputs = model(x).float()
                loss_sum += bound.val_loss_sum(outputs, y)
                kept.append(bound.keep(outputs))
                targets.append(y)
    finally:
        model.train(was_training)  # restore, so evaluation can be called from anywhere
    if not targets:
        raise ValueError("cannot evaluate an empty split")
    y_all = torch.cat(targets).cpu()  # one device sync per evaluation
    stats = bound.split_metrics(torch.cat(kept).cpu(), y_all)
    stats["loss"] = float(loss_sum) / len(y_all)
    stats["n"] = int(len(y_all))
    return stats


def evaluate(
    model: nn.Module,
    dataset: Dataset,
    *,
    num_classes: int,
    device: str | torch.device = "cpu",
    batch_size: int = 512,
    amp: str = "off",
    bound: Any = None,
) -> dict[str, Any]:
    """Evaluate a model on a split (e.g. the held-out test split).

    Classification (bound None): {"loss": mean cross-entropy, "acc", "macro_f1", "recall": per-class
    list (nan for a class absent from the split), "n": samples}; other tasks: their metrics (train/tasks/). The model is moved to `device` ("auto", "cpu",
    "cuda", "cuda:1", ...); its train/eval mode is restored afterwards.
    """
    if isinstance(device, str) and device in ("auto", "cpu", "cuda"):
        dev = resolve_device(device)
    else:
        dev = torch.device(device)
    resolved_amp = resolve_amp(amp, dev)
    model.to(dev)
    target_dtype = bound.task.target_dtype if bound is not None else torch.long
    batches = eval_batches(dataset, batch_size, dev, target_dtype=target_dtype)
    return evaluate_batches(model, batches, num_classes=num_classes, device=dev, amp=resolved_amp, bound=bound)
