"""The serving model: raw inputs in, the task's predictions out, with the experiment's own preprocessing
inside (classification: logits; regression: values in the target's units; multilabel: per-label
probabilities; custom: the experiment's predict(outputs), else its raw outputs). That is what the
network module (and mlflow.pytorch, ONNX, TorchScript) returns; the registered model's pyfunc and
`hpolab predict` shape it into the task's table (hpolab_pyfunc.output_frame: class, label, prob_<c>...).

A trial's logged model takes *model inputs* (already preprocessed). What we deploy takes what the
user has (digits: float32 (N, 8, 8) in 0..16; Fashion-MNIST: uint8 (N, 28, 28)), so promote wraps
the trained network as `ServingModel(experiment preprocess, model)`. The MLflow model (torch.export
"pt2"), the ONNX file and the TorchScript file are all exported from that one module, so every
way of loading the champion applies exactly the preprocessing that training used.

Also here: the raw test split and its fingerprint, batched CPU inference, and the classification
metrics promote reports (re-exported from hpolab.train.metrics). Everything runs on the CPU on
purpose: the accuracy promote reports is then the one `mlflow.pyfunc.load_model(...)` reproduces
(pyfunc loads onto the CPU by default).
"""

from __future__ import annotations

import hashlib
import json
from types import ModuleType
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

# The one implementation lives with the training routine; promote imports it from here.
from hpolab.registry.hpolab_pyfunc import PREDICT_BATCH, forward  # noqa: F401  (PREDICT_BATCH re-exported)
from hpolab.train.data import data_seed_of
from hpolab.train.metrics import classification_metrics  # noqa: F401  (re-exported)


# Tags on the logged serving model and on its registered version: what `hpolab predict` needs to
# turn a user's file into the model's raw input, and to name the predicted classes.
TAG_EXPERIMENT = "hpolab.experiment"
TAG_RAW_SHAPE = "hpolab.raw_input_shape"  # JSON list, one sample (no batch axis)
TAG_RAW_DTYPE = "hpolab.raw_input_dtype"  # numpy dtype name, e.g. float32 / uint8
TAG_CLASS_NAMES = "hpolab.class_names"  # JSON list
TAG_NUM_CLASSES = "hpolab.num_classes"
TAG_TEST_FINGERPRINT = "hpolab.test_fingerprint"  # sha256 of the raw test inputs and labels
TAG_TASK = "hpolab.task"  # classification | regression | multilabel | custom (what predict prints)
TAG_THRESHOLD = "hpolab.multilabel_threshold"


class ServingModel(nn.Module):
    """raw batch -> predictions: `preprocess` (the experiment's, as in training), the trained model, then
    the task's `head` (None for classification: logits)."""

    def __init__(self, preprocess: Callable[[torch.Tensor], torch.Tensor] | None, model: nn.Module, head: nn.Module | None = None):
        super().__init__()
        self.preprocess = preprocess  # a plain function, not a module: it has no state
        self.model = model
        self.head = head

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        x = self.preprocess(raw) if self.preprocess is not None else raw
        out = self.model(x)
        return self.head(out) if self.head is not None else out


def raw_test_split(experiment: ModuleType, config: dict[str, Any], target_dtype: str | None = "int64") -> tuple[np.ndarray, np.ndarray]:
    """The experiment's test split as raw inputs (what predict accepts) and targets in the task's dtype
    (int64 labels for classification, float32 for regression/multilabel, as given for custom)."""
    from hpolab.errors import UserError

    fn = getattr(experiment, "raw_test", None)
    if fn is None:
        raise UserError(
            f"experiment {experiment.__name__} has no raw_test(data, data_seed): promote evaluates the raw test "
            "split through the experiment's preprocessing (see experiments/README.md)"
        )
    x, y = fn(config["data"], data_seed_of(config))
    return np.ascontiguousarray(x), (np.asarray(y, dtype=target_dtype) if target_dtype else np.asarray(y))


def fingerprint(x: np.ndarray, y: np.ndarray) -> str:
    """Identifies a test split: two models are compared only on the very same inputs and labels."""
    h = hashlib.sha256()
    h.update(json.dumps([str(x.dtype), list(x.shape)]).encode())
    h.update(np.ascontiguousarray(x).tobytes())
    h.update(np.ascontiguousarray(y).tobytes())  # int64 labels for classification, as always
    return h.hexdigest()


def predict_logits(model: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray, batch_size: int = PREDICT_BATCH) -> torch.Tensor:
    """Logits (float32, CPU) for raw inputs `x`, batch by batch. Works for eager modules and for
    torch.export'ed ones (which cannot be switched to eval mode: they were exported in it)."""
    if isinstance(model, nn.Module):
        try:
            model.eval()
        except NotImplementedError:  # torch.export'ed: already in eval mode, and cannot be switched
            pass
    return forward(model, x, batch_size)  # the served pyfunc's own batching, so both agree


def serving_tags(experiment_name: str, x_raw: np.ndarray, y: np.ndarray, num_classes: int, class_names: tuple[str, ...],
                 task: str = "classification", threshold: float | None = None) -> dict[str, str]:
    return {
        TAG_TASK: task,
        **({TAG_THRESHOLD: repr(threshold)} if threshold is not None else {}),
        TAG_EXPERIMENT: experiment_name,
        TAG_RAW_SHAPE: json.dumps(list(x_raw.shape[1:])),
        TAG_RAW_DTYPE: str(x_raw.dtype),
        TAG_NUM_CLASSES: str(num_classes),
        TAG_CLASS_NAMES: json.dumps(list(class_names)),
        TAG_TEST_FINGERPRINT: fingerprint(x_raw, y),
    }
