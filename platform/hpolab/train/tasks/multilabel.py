"""Task multilabel: binary cross-entropy per label (optional pos_weight); val_micro_f1, val_macro_f1
and val_map; serving returns per-label probabilities."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import TrainConfig
from .common import MULTILABEL_ONLY, foreign_options


class Multilabel:
    name = "multilabel"
    target_dtype = torch.float32
    numpy_target_dtype = "float32"

    def metric_directions(self, cfg: TrainConfig, num_outputs: int | None = None) -> dict[str, str]:
        return {"val_loss": "minimize", "val_micro_f1": "maximize", "val_macro_f1": "maximize", "val_map": "maximize"}

    def direction_of(self, metric: str, cfg: TrainConfig) -> str | None:
        return self.metric_directions(cfg).get(metric)

    def metric_hint(self, metric: str) -> str:
        return ""

    def check_config(self, cfg: TrainConfig) -> list[str]:
        return foreign_options(self.name, cfg, MULTILABEL_ONLY + ("class_weighting",))

    def check_targets(self, targets: torch.Tensor, num_outputs: int) -> None:
        t = torch.as_tensor(targets)
        if t.dim() != 2 or t.shape[1] != num_outputs:
            raise ValueError(f"task multilabel expects targets of shape (N, {num_outputs}) (one 0/1 column per label, "
                             f"num_classes = {num_outputs} labels); got {tuple(t.shape)}")
        if not bool(((t == 0) | (t == 1)).all()):
            raise ValueError("task multilabel expects targets in {0, 1}; got other values")

    def bind(self, cfg: TrainConfig, data, device: torch.device) -> "BoundMultilabel":
        from ..data import targets_of

        pos_weight = None
        if cfg.class_weighting == "inverse_freq":  # BCE pos_weight = negatives / positives, per label
            y = targets_of(data.train).double()
            pos = y.sum(0)
            pos_weight = ((len(y) - pos) / pos.clamp(min=1)).float().to(device)
        return BoundMultilabel(self, pos_weight, cfg.multilabel_threshold)

    def unbound(self, num_outputs: int, threshold: float = 0.5) -> "BoundMultilabel":
        return BoundMultilabel(self, None, threshold)


@dataclass
class BoundMultilabel:
    task: Multilabel
    pos_weight: torch.Tensor | None
    threshold: float  # probability at or above which a label is predicted

    def criterion(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs.float(), targets.float(), pos_weight=self.pos_weight)

    def val_loss_sum(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # plain BCE (no pos_weight): comparable across trials; mean over labels, summed over samples
        per = F.binary_cross_entropy_with_logits(outputs.float(), targets.float(), reduction="none")
        return per.double().mean(dim=1).sum()

    def keep(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs

    def split_metrics(self, kept: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        return multilabel_stats(torch.sigmoid(kept.float()), targets, self.threshold)

    def epoch_metrics(self, val: dict[str, Any]) -> dict[str, float]:
        return {"val_micro_f1": val["micro_f1"], "val_macro_f1": val["macro_f1"], "val_map": val["map"]}

    def head(self) -> nn.Module | None:
        return nn.Sigmoid()  # per-label probabilities

    def evaluate_served(self, served: torch.Tensor, y) -> dict[str, float]:
        y = torch.as_tensor(y).double()
        p = served.double().clamp(1e-7, 1 - 1e-7)
        loss = float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())
        return {"loss": loss, **multilabel_stats(served, y, self.threshold), "n": int(len(y))}


def multilabel_stats(probs: torch.Tensor, targets: torch.Tensor, threshold: float) -> dict[str, float]:
    """micro-F1 and macro-F1 at `threshold` (macro over labels seen in targets or predictions), and mean
    average precision over the labels with at least one positive."""
    y = torch.as_tensor(targets).double()
    p = probs.double()
    pred = (p >= threshold).double()
    tp, fp, fn = (pred * y).sum(0), (pred * (1 - y)).sum(0), ((1 - pred) * y).sum(0)
    denom = 2 * tp + fp + fn
    micro = float(2 * tp.sum() / denom.sum()) if denom.sum() > 0 else math.nan
    seen = denom > 0
    macro = float((2 * tp[seen] / denom[seen]).mean()) if seen.any() else math.nan
    aps = []
    for j in range(y.shape[1]):
        n_pos = y[:, j].sum()
        if n_pos == 0:
            continue
        order = torch.argsort(p[:, j], descending=True, stable=True)
        hits = y[order, j]
        precision_at_k = hits.cumsum(0) / torch.arange(1, len(hits) + 1, dtype=torch.float64)
        aps.append(float((precision_at_k * hits).sum() / n_pos))
    return {"micro_f1": micro, "macro_f1": macro, "map": sum(aps) / len(aps) if aps else math.nan}
