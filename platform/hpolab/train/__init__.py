"""The shared training routine: `fit()` and what it needs. Imports torch/torchvision/numpy only.

    from hpolab.train import fit, TrainConfig, DataSplits
    result = fit(TrainConfig(max_epochs=5), model, data, metric="val_acc", direction="maximize", seed=0)

The names below are imported on first use (PEP 562): `hpolab.train.config` (the plain TrainConfig
dataclass the spec loader validates against) must not cost the torch import (seconds) that `fit`
and the checkpoints need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .checkpoint import load_checkpoint, load_model_state
    from .config import TrainConfig
    from .data import DataSplits
    from .evaluation import evaluate
    from .loop import FitResult, fit
    from .nonfinite import NonFiniteLossError
    from .seeding import seed_everything

# name -> the submodule that defines it
_WHERE = {
    "DataSplits": "data",
    "FitResult": "loop",
    "NonFiniteLossError": "nonfinite",
    "TrainConfig": "config",
    "evaluate": "evaluation",
    "fit": "loop",
    "load_checkpoint": "checkpoint",
    "load_model_state": "checkpoint",
    "seed_everything": "seeding",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
