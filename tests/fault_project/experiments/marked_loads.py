"""The fault project's MLP whose load_data notes every call: a line "<pid> <working directory>" in the
file HPOLAB_TEST_LOADS_FILE names (for the standby trial process's tests: which process loaded a
trial's data, and where). With data.draw: true it also draws from torch's global RNG as it loads:
loading it before the trial is seeded would change what the trial draws, so a standby must not keep
that preload.
If HPOLAB_TEST_IMPORTS_DIR is set, build_model writes the modules its process imported since it was
forked to <pid>.txt there (one per line): what a trial process imports that its forkserver had not."""

from __future__ import annotations

import os
import sys

import torch

from experiments.faulty import MODEL_DEFAULTS  # noqa: F401 -- the same model and defaults
from experiments.faulty import build_model as _faulty_model
from experiments.faulty import load_data as _faulty_data

_at_fork: set[str] = set(sys.modules)  # (the modules at this process's fork: a forked child sets them again)
os.register_at_fork(after_in_child=lambda: _at_fork.__init__(sys.modules))

DATA_DEFAULTS = {"draw": False}


def load_data(data: dict, seed: int):
    path = os.environ.get("HPOLAB_TEST_LOADS_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {os.getcwd()}\n")
    if data.get("draw"):
        torch.rand(3)
    return _faulty_data({}, seed)


def build_model(model: dict, input_shape, num_classes):
    folder = os.environ.get("HPOLAB_TEST_IMPORTS_DIR")
    if folder:
        with open(os.path.join(folder, f"{os.getpid()}.txt"), "w") as f:
            f.writelines(f"{name}\n" for name in sorted(set(sys.modules) - _at_fork))
    return _faulty_model(model, input_shape, num_classes)
