"""Small layers the shipped experiments share."""

from __future__ import annotations

import torch
from torch import nn


class GlobalAvgPool(nn.Module):
    """Mean over the spatial axes: (N, C, H, W) -> (N, C) (or (N, C, 1, 1) with keepdim).

    Same result as nn.AdaptiveAvgPool2d(1) + flatten, but its CUDA backward is deterministic
    (adaptive_avg_pool2d_backward has no deterministic CUDA kernel), so `trainer.deterministic:
    true` works on a GPU. Exports to ONNX as ReduceMean.
    """

    def __init__(self, keepdim: bool = False):
        super().__init__()
        self.keepdim = keepdim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3), keepdim=self.keepdim)
