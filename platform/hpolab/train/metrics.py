"""Classification metrics from labels and predictions: accuracy, macro-F1, per-class recall.

One implementation for the training loop's validation and for serving/promotion's test metrics.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F


def classification_stats(labels: torch.Tensor, preds: torch.Tensor, num_classes: int) -> dict[str, Any]:
    """{"acc", "macro_f1", "recall": per-class list (nan for a class absent from the labels)}.

    `labels` and `preds` are 1-D int64 tensors on the CPU: bincount on CUDA is not allowed under
    deterministic algorithms. Labels outside 0..num_classes-1 are rejected.
    """
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must be in 0..{num_classes - 1}, got {int(labels.min())}..{int(labels.max())}")
    conf = torch.bincount(labels * num_classes + preds, minlength=num_classes * num_classes).reshape(num_classes, num_classes)
    conf = conf.double()
    tp, support, predicted = conf.diag(), conf.sum(1), conf.sum(0)
    recall = [float(tp[c] / support[c]) if support[c] > 0 else math.nan for c in range(num_classes)]
    # Macro F1 over the classes that occur in the labels or the predictions (as scikit-learn does).
    seen = (support + predicted) > 0
    f1 = 2 * tp[seen] / (support[seen] + predicted[seen])
    return {
        "acc": float(tp.sum() / max(labels.numel(), 1)),
        "macro_f1": float(f1.mean()) if seen.any() else math.nan,
        "recall": recall,
    }


def classification_metrics(logits: torch.Tensor, y: Any, num_classes: int) -> dict[str, float]:
    """acc, loss (mean cross-entropy, float64), macro_f1 (classes in labels or predictions), n.

    `logits` (N, num_classes) on the CPU; `y` the N integer labels (a tensor or a numpy array).
    """
    labels = torch.as_tensor(y, dtype=torch.long)
    stats = classification_stats(labels, logits.argmax(dim=1), num_classes)
    return {
        "acc": stats["acc"],
        "loss": float(F.cross_entropy(logits.double(), labels)),
        "macro_f1": stats["macro_f1"],
        "n": int(labels.numel()),
    }
