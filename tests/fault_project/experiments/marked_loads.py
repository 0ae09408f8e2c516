"""The fault project's MLP whose load_data notes every call: a line "<pid> <working directory>" in the
file HPOLAB_TEST_LOADS_FILE names (for the standby trial process's tests: which process loaded a
trial's data, and where). With data.draw: true it also draws from torch's global RNG as it loads:
loading it before the trial is seeded would change what the trial draws, so a standby must not keep
that preload."""

from __future__ import annotations

import os

import torch

from experiments.faulty import MODEL_DEFAULTS, build_model  # noqa: F401 -- the same model and defaults
from experiments.faulty import load_data as _faulty_data

DATA_DEFAULTS = {"draw": False}


def load_data(data: dict, seed: int):
    path = os.environ.get("HPOLAB_TEST_LOADS_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {os.getcwd()}\n")
    if data.get("draw"):
        torch.rand(3)
    return _faulty_data({}, seed)
