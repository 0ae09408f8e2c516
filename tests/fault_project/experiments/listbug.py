"""A model with the classic bug: layers kept in a python list, so .parameters() misses them."""

from __future__ import annotations

from torch import nn

from experiments.faulty import DATA_DEFAULTS, load_data  # noqa: F401  (same data as `faulty`)

MODEL_DEFAULTS = {"hidden": 32}


class ListBug(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.layers = [nn.Linear(64, hidden), nn.Linear(hidden, 10)]  # should be nn.ModuleList
        self.scale = nn.Parameter(nn.init.ones_(nn.Linear(1, 1).weight.detach().clone()))

    def forward(self, x):
        return self.layers[1](self.layers[0](x).relu()) * self.scale


def build_model(model: dict, input_shape, num_classes) -> nn.Module:
    return ListBug(int(model["hidden"]))
