"""The champion's pyfunc: raw inputs in, a task-shaped table out -- and nothing of hpolab needed to load it.

`hpolab promote` copies THIS FILE into every serving model it logs (MLflow `code_paths`: the model's
code/ folder) and names it the model's pyfunc `loader_module`. So `mlflow.pyfunc.load_model(
"models:/NAME@champion")` and `mlflow models serve` import it as the top-level module `hpolab_pyfunc`
(a name no user project should have) from the model itself: it imports only numpy, pandas, torch and
mlflow, never hpolab or the experiment (the experiment's preprocessing is inside the exported graph).
`hpolab predict` imports the same functions as hpolab.registry.hpolab_pyfunc, so the two always agree.

The output (one row per input; `<c>` = the declared class / label / target name, else its index 0..k-1):

    classification  class (int64 index), label (str: the class name, or the index), prob_<c> (float32,
                    softmax; one column per class, summing to 1)
    multilabel      label_<c> (int64 0/1: probability >= the study's multilabel_threshold), prob_<c> (float32)
    regression      prediction (float32, the target's units; target standardisation undone), or
                    prediction_<c> per target when there are several
    custom          the served outputs as a numpy array (the experiment's predict(outputs), else the model's
                    raw outputs): the experiment defines what they mean

The task, class names and threshold are the pyfunc flavour's `model_config` (in the MLmodel file); a
user may override one at load time, e.g. `mlflow.pyfunc.load_model(uri, model_config={"multilabel_threshold":
0.7})` (then the labels no longer match `hpolab predict`, which uses the study's).
"""

from __future__ import annotations

import os
from typing import Any

PREDICT_BATCH = 512  # inputs per forward pass

# model_config keys (with the flavour's own "device")
TASK, CLASS_NAMES, THRESHOLD = "hpolab_task", "class_names", "multilabel_threshold"


def suffixes(k: int, names) -> list[str]:
    """Column suffixes of k outputs: the declared names when there are k distinct ones, else 0..k-1."""
    names = [str(n) for n in (names or [])]
    return names if len(names) == k and len(set(names)) == k else [str(j) for j in range(k)]


def output_frame(task: str, served, class_names=(), threshold: float = 0.5):
    """The served model's outputs (N, k) -> the task's table (module docstring); custom: the array itself."""
    import numpy as np
    import pandas as pd
    import torch

    out = torch.as_tensor(served).detach().float().cpu()
    if task == "custom":
        return out.numpy()
    out = out.reshape(len(out), -1)
    cols = suffixes(out.shape[1], class_names)
    if task == "classification":
        index = out.argmax(dim=1).numpy().astype(np.int64)  # on the logits: what test_acc counts
        probs = torch.softmax(out, dim=1).numpy()
        frame = {"class": index, "label": np.array([cols[i] for i in index], dtype=object)}
        frame.update({f"prob_{c}": probs[:, j] for j, c in enumerate(cols)})
    elif task == "multilabel":
        probs = out.numpy()
        frame = {f"label_{c}": (probs[:, j] >= threshold).astype(np.int64) for j, c in enumerate(cols)}
        frame.update({f"prob_{c}": probs[:, j] for j, c in enumerate(cols)})
    elif task == "regression":
        values = out.numpy()
        frame = {"prediction": values[:, 0]} if values.shape[1] == 1 else {f"prediction_{c}": values[:, j] for j, c in enumerate(cols)}
    else:
        raise ValueError(f"unknown task {task!r}")
    return pd.DataFrame(frame)


def forward(model, x, batch_size: int = PREDICT_BATCH):
    """The model's outputs (float32, CPU) for raw inputs `x` (a numpy array), batch by batch."""
    import numpy as np
    import torch

    outs = []
    with torch.inference_mode():
        for lo in range(0, len(x), batch_size):
            outs.append(model(torch.from_numpy(np.ascontiguousarray(x[lo : lo + batch_size]))).float().cpu())
    if not outs:
        raise ValueError("no inputs to predict")
    return torch.cat(outs)


class ServedModel:
    """What `mlflow.pyfunc` wraps: predict(raw inputs) -> output_frame(...)."""

    def __init__(self, model, config: dict[str, Any]):
        self.model = model
        self.task = config.get(TASK, "classification")
        self.class_names = list(config.get(CLASS_NAMES) or [])
        self.threshold = float(config.get(THRESHOLD, 0.5))

    def predict(self, model_input, params=None):
        import numpy as np

        if hasattr(model_input, "to_numpy"):  # a DataFrame (e.g. dataframe_split): one row per input
            model_input = model_input.to_numpy()
        x = np.asarray(model_input)
        return output_frame(self.task, forward(self.model, x), self.class_names, self.threshold)


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> ServedModel:
    """MLflow's loader hook. `data_path` is the pytorch flavour's data folder (the torch.export'ed model),
    in the model folder whose MLmodel file we load it through. On the CPU, where promote exported and
    evaluated it (a torch.export'ed program runs on the device it was exported on)."""
    import mlflow.pytorch

    config = dict(model_config or {})
    model = mlflow.pytorch.load_model(os.path.dirname(os.path.abspath(data_path)), map_location="cpu")
    try:
        model.eval()
    except (NotImplementedError, AttributeError):  # torch.export'ed: exported in eval mode, cannot switch
        pass
    return ServedModel(model, config)
