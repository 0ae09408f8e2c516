"""Task regression: the trainer's regression_loss (mse, huber, l1) on standardised targets; val_rmse,
val_mae (in the user's units) and val_r2; serving returns predictions in the user's units."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import TrainConfig
from .common import REGRESSION_ONLY, foreign_options


def _as_2d(targets: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    return targets.reshape(outputs.shape) if targets.dim() == 1 and outputs.dim() == 2 and outputs.shape[1] == 1 else targets


class Standardized(nn.Module):
    """Model outputs in standard units -> the user's units: outputs * std + mean (per output)."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.register_buffer("mean", mean.float().reshape(1, -1))
        self.register_buffer("std", std.float().reshape(1, -1))

    def forward(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.float() * self.std + self.mean


REGRESSION_LOSSES: dict[str, Callable[..., torch.Tensor]] = {"mse": F.mse_loss, "huber": F.huber_loss, "l1": F.l1_loss}


class Regression:
    name = "regression"
    target_dtype = torch.float32
    numpy_target_dtype = "float32"

    def metric_directions(self, cfg: TrainConfig, num_outputs: int | None = None) -> dict[str, str]:
        return {"val_loss": "minimize", "val_rmse": "minimize", "val_mae": "minimize", "val_r2": "maximize"}

    def direction_of(self, metric: str, cfg: TrainConfig) -> str | None:
        return self.metric_directions(cfg).get(metric)

    def metric_hint(self, metric: str) -> str:
        return " (regression reports errors in your units: val_rmse, val_mae; val_r2; val_loss is the trainer's regression_loss)" if metric == "val_acc" else ""

    def check_config(self, cfg: TrainConfig) -> list[str]:
        return foreign_options(self.name, cfg, REGRESSION_ONLY)

    def check_targets(self, targets: torch.Tensor, num_outputs: int) -> None:
        t = torch.as_tensor(targets)
        if not t.is_floating_point():
            raise ValueError(f"task regression expects float targets of shape (N,) or (N, {num_outputs}), got {t.dtype} "
                             "(integer class labels? leave TASK unset for classification; else convert targets to float32)")
        ok = (t.dim() == 1 and num_outputs == 1) or (t.dim() == 2 and t.shape[1] == num_outputs)
        if not ok:
            raise ValueError(f"task regression expects targets of shape (N,) with one model output or (N, k) with k = "
                             f"num_classes outputs (here {num_outputs}); got {tuple(t.shape)}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError("task regression expects finite targets; some are NaN or inf")

    def bind(self, cfg: TrainConfig, data, device: torch.device) -> "BoundRegression":
        from ..data import targets_of

        k = data.num_classes
        if cfg.standardize_targets:
            y = targets_of(data.train).double().reshape(len(data.train), -1)
            mean, std = y.mean(0), y.std(0, unbiased=False)
            std = torch.where(std > 0, std, torch.ones_like(std))  # a constant target: keep its units
        else:
            mean, std = torch.zeros(k, dtype=torch.float64), torch.ones(k, dtype=torch.float64)
        return BoundRegression(self, cfg.regression_loss, Standardized(mean, std).to(device))

    def unbound(self, num_outputs: int, loss: str = "mse") -> "BoundRegression":
        return BoundRegression(self, loss, Standardized(torch.zeros(num_outputs), torch.ones(num_outputs)))


@dataclass
class BoundRegression:
    task: Regression
    loss_name: str
    scale: Standardized  # the inverse of the target standardisation (identity when it is off)

    def _standard(self, targets: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        t = _as_2d(targets, outputs)
        if t.shape != outputs.shape:
            raise ValueError(f"task regression: model outputs {tuple(outputs.shape)} do not match targets {tuple(targets.shape)}; "
                             "build_model must return (N, num_classes) with num_classes = the number of targets")
        return (t.float() - self.scale.mean) / self.scale.std

    def criterion(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        outputs = outputs.float()
        return REGRESSION_LOSSES[self.loss_name](outputs, self._standard(targets, outputs))

    def val_loss_sum(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # mean over the outputs of each sample, summed over samples: / N gives the criterion's mean
        per = REGRESSION_LOSSES[self.loss_name](outputs, self._standard(targets, outputs), reduction="none")
        return per.double().mean(dim=1).sum()

    def keep(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs

    def split_metrics(self, kept: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        return regression_stats(self.scale.cpu()(kept), targets)

    def epoch_metrics(self, val: dict[str, Any]) -> dict[str, float]:
        return {"val_rmse": val["rmse"], "val_mae": val["mae"], "val_r2": val["r2"]}

    def head(self) -> nn.Module | None:
        return self.scale.cpu()

    def evaluate_served(self, served: torch.Tensor, y) -> dict[str, float]:
        y = torch.as_tensor(y)
        scale = self.scale.cpu()
        pred = served.float()
        loss = self.val_loss_sum((pred - scale.mean) / scale.std, y) / len(y)
        return {"loss": float(loss), **regression_stats(pred, y), "n": int(len(y))}


def regression_stats(pred: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """rmse and mae over every target value; r2 per output, averaged (scikit-learn's uniform_average)."""
    y = _as_2d(torch.as_tensor(targets), pred).double()
    p = pred.double().reshape(y.shape)
    err = p - y
    ss_tot = ((y - y.mean(0)) ** 2).sum(0)
    r2 = 1 - (err**2).sum(0) / torch.where(ss_tot > 0, ss_tot, torch.full_like(ss_tot, math.nan))
    return {"rmse": float(err.pow(2).mean().sqrt()), "mae": float(err.abs().mean()), "r2": float(r2.mean())}
