"""Task classification: cross-entropy / label smoothing / focal / class weights for training, plain
cross-entropy as val_loss; val_acc (and val_macro_f1, val_recall_<class> when an imbalance option is
on). Exactly the routine's behaviour before tasks existed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import TrainConfig
from ..metrics import classification_metrics, classification_stats
from .common import CLASSIFICATION_ONLY, foreign_options


def _imbalance_on(cfg: TrainConfig) -> bool:
    return cfg.class_weighting != "none" or cfg.balanced_sampler or cfg.focal_gamma > 0


class Classification:
    name = "classification"
    target_dtype = torch.long  # what batches convert targets to
    numpy_target_dtype = "int64"

    def metric_directions(self, cfg: TrainConfig, num_outputs: int | None = None) -> dict[str, str]:
        out = {"val_loss": "minimize", "val_acc": "maximize"}
        if _imbalance_on(cfg):
            out["val_macro_f1"] = "maximize"
            out.update({f"val_recall_{c}": "maximize" for c in range(num_outputs or 0)})
        return out

    def direction_of(self, metric: str, cfg: TrainConfig) -> str | None:
        if metric.startswith("val_recall_") and metric[len("val_recall_"):].isdigit() and _imbalance_on(cfg):
            return "maximize"
        return self.metric_directions(cfg).get(metric)

    def metric_hint(self, metric: str) -> str:
        if metric == "val_macro_f1" or metric.startswith("val_recall_"):
            return (" (val_macro_f1 and val_recall_<class> exist when an imbalance option is on: "
                    "class_weighting, balanced_sampler or focal_gamma)")
        return ""

    def check_config(self, cfg: TrainConfig) -> list[str]:
        return foreign_options(self.name, cfg, CLASSIFICATION_ONLY + ("class_weighting",))

    def check_targets(self, targets: torch.Tensor, num_outputs: int) -> None:
        t = torch.as_tensor(targets)
        if t.is_floating_point() and not bool((t == t.round()).all()):
            raise ValueError(f"task classification expects integer class labels 0..{num_outputs - 1} of shape (N,); "
                             f"got non-integer {t.dtype} targets (a regression experiment? set TASK = \"regression\")")
        if t.dim() != 1:
            raise ValueError(f"task classification expects class labels of shape (N,), got {tuple(t.shape)} "
                             "(one-hot or multi-label targets? use TASK = \"multilabel\")")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_outputs):
            raise ValueError(f"task classification expects labels in 0..{num_outputs - 1} (num_classes={num_outputs}), "
                             f"got {int(t.min())}..{int(t.max())}")

    def bind(self, cfg: TrainConfig, data, device: torch.device) -> "BoundClassification":
        from ..losses import criterion_from_config

        return BoundClassification(self, criterion_from_config(cfg, data, device), data.num_classes, _imbalance_on(cfg))

    def unbound(self, num_outputs: int) -> "BoundClassification":
        """For served predictions only (promote, the champion): no training criterion."""
        return BoundClassification(self, None, num_outputs, False)


@dataclass
class BoundClassification:
    task: Classification
    criterion: Any  # nn.Module (cross-entropy / focal, with the trainer's options)
    num_outputs: int
    imbalance: bool

    def val_loss_sum(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets, reduction="sum")  # plain CE: comparable across trials

    def keep(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.argmax(dim=1)  # predicted classes are all the metrics need

    def split_metrics(self, kept: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        return classification_stats(targets, kept, self.num_outputs)

    def epoch_metrics(self, val: dict[str, Any]) -> dict[str, float]:
        out = {"val_acc": val["acc"]}
        if self.imbalance:
            out["val_macro_f1"] = val["macro_f1"]
            out.update({f"val_recall_{c}": r for c, r in enumerate(val["recall"])})
        return out

    def head(self) -> nn.Module | None:
        return None  # serving returns logits, as always; predict turns them into classes + probabilities

    def evaluate_served(self, served: torch.Tensor, y) -> dict[str, float]:
        return classification_metrics(served, y, self.num_outputs)
