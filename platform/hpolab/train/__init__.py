"""The shared training routine: `fit()` and what it needs. Imports torch/torchvision/numpy only.

    from hpolab.train import fit, TrainConfig, DataSplits
    result = fit(TrainConfig(max_epochs=5), model, data, metric="val_acc", direction="maximize", seed=0)
"""

from .checkpoint import load_checkpoint, load_model_state
from .config import TrainConfig
from .data import DataSplits
from .evaluation import evaluate
from .loop import FitResult, fit
from .nonfinite import NonFiniteLossError
from .seeding import seed_everything

__all__ = [
    "DataSplits",
    "FitResult",
    "NonFiniteLossError",
    "TrainConfig",
    "evaluate",
    "fit",
    "load_checkpoint",
    "load_model_state",
    "seed_everything",
]
