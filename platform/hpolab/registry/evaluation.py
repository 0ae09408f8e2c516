"""The challenger on the held-out test split, and its exports: everything that can fail before anything
is written (files go to a temporary folder only).

- The experiment's raw test inputs through the serving model (preprocessing inside) must reproduce
  what the model sees on the test split in training, else the accuracy we report is not the model's.
- ONNX (dynamic batch axis) and TorchScript exports; ONNX Runtime on the test inputs must agree with
  PyTorch within export.ONNX_TOLERANCE (max abs logit difference). A model registered as it was
  logged (candidate.py) is exported from its input example instead, and skipped with the reason
  where it does not export.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EXAMPLE_ROWS = 4  # raw test rows used as the export / input example (> 1 keeps the batch axis dynamic)
PREPROCESS_CHECK_ROWS = 256  # test rows on which raw_test + preprocess must reproduce the test split
PREPROCESS_TOLERANCE = 1e-4  # max abs logit difference between those two paths


class PromotionFailed(RuntimeError):
    """The promotion could not be completed; the message says why (exit 1)."""


@dataclass
class Evaluation:
    """The challenger's serving model on the raw held-out test split."""

    serving: Any  # serving.ServingModel: raw inputs in, the task's predictions out
    num_classes: int
    class_names: tuple[str, ...]
    x_raw: np.ndarray
    y: np.ndarray
    fingerprint: str  # of x_raw and y: a champion is comparable only on the same split
    logits: Any  # torch.Tensor (N, num_classes): the served predictions (logits for classification)
    metrics: dict[str, float]  # the task's test metrics: loss, n, and e.g. acc, macro_f1 | rmse, mae, r2 | micro_f1, map
    bound: Any = None  # the task bound to the data (train/tasks/)


@dataclass
class Exports:
    onnx: Path
    torchscript: Path
    exporter: str  # which ONNX exporter made the file
    onnx_diff: float  # max abs logit difference vs PyTorch on the test inputs
    torchscript_diff: float


def evaluate_challenger(exp, config: dict, splits, model, serving, bound) -> Evaluation:
    from hpolab.registry.serving import fingerprint, predict_logits, raw_test_split

    x_raw, y = raw_test_split(exp, config, bound.task.numpy_target_dtype)
    check_raw_test(splits, model, serving, x_raw, y)
    logits = predict_logits(serving, x_raw)
    return Evaluation(
        serving=serving,
        num_classes=splits.num_classes,
        class_names=tuple(splits.class_names),
        x_raw=x_raw,
        y=y,
        fingerprint=fingerprint(x_raw, y),
        logits=logits,
        metrics=bound.evaluate_served(logits, y),
        bound=bound,
    )


def check_raw_test(splits, model, serving, x_raw: np.ndarray, y: np.ndarray) -> None:
    """raw_test + preprocess must reproduce the test split the experiment feeds the model."""
    import torch

    from hpolab.train.data import targets_of

    if len(x_raw) != len(splits.test) or not np.array_equal(targets_of(splits.test).numpy().astype(y.dtype), y):
        raise PromotionFailed("the experiment's raw_test() does not match its load_data().test (sizes or targets differ); fix the experiment")
    n = min(PREPROCESS_CHECK_ROWS, len(x_raw))
    inputs = torch.stack([torch.as_tensor(splits.test[i][0]) for i in range(n)]).float()
    with torch.inference_mode():
        a = model(inputs).float()
        if serving.head is not None:
            a = serving.head(a).float()  # compared as served: predictions in the task's units
        b = serving(torch.from_numpy(x_raw[:n])).float()
    diff = float((a - b).abs().max())
    if diff > PREPROCESS_TOLERANCE:
        raise PromotionFailed(
            f"preprocess(raw_test) differs from the test split the model sees in training (max abs logit diff {diff:.3g} "
            f"> {PREPROCESS_TOLERANCE:g}); the experiment's preprocess must equal its eval transform"
        )


def export_and_check(ev: Evaluation, folder: Path) -> Exports:
    """ONNX + TorchScript of the serving model, each run on the test inputs against PyTorch; PromotionFailed
    when either fails (the served model's exports are part of what promote registers)."""
    import torch

    from hpolab.registry.export import ONNX_TOLERANCE, ExportError  # (read at call time: tests tighten it)

    reference = ev.logits.numpy()
    # Logits and probabilities are O(1); regression values are in the target's units (e.g. 300), where
    # float32 alone differs by ~1e-5: the limit scales with the largest served value.
    limit = ONNX_TOLERANCE * (max(1.0, float(np.abs(reference).max())) if ev.bound.task.name != "classification" else 1.0)
    try:
        return export_checked(ev.serving, torch.from_numpy(ev.x_raw[:EXAMPLE_ROWS]), ev.x_raw, reference, folder, limit,
                              f"{len(ev.x_raw)} test inputs")
    except ExportError as e:
        raise PromotionFailed(f"{e}; nothing was registered") from e


def export_or_skip(model, example: np.ndarray | None, folder: Path) -> tuple[Exports | None, str | None]:
    """(Exports or None, why they were skipped or None): a model registered as it was logged is exported
    from its input example; one that does not export (e.g. it only runs on the GPU it trained on) is
    still registered, the reason recorded."""
    import torch

    from hpolab.registry.export import ONNX_TOLERANCE

    if example is None or example.dtype == object:
        return None, "the logged model has no array input example"
    if not isinstance(model, torch.nn.Module):
        return None, f"the logged model loads as {type(model).__name__}, not a torch.nn.Module"
    x = np.ascontiguousarray(example)
    try:
        with torch.inference_mode():
            reference = model(torch.from_numpy(x)).float().numpy()
        limit = ONNX_TOLERANCE * max(1.0, float(np.abs(reference).max()))
        return export_checked(model, torch.from_numpy(x), x, reference, folder, limit, "the input example"), None
    except Exception as e:  # noqa: BLE001 -- recorded on the version, not fatal
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]


def export_checked(model, example, x: np.ndarray, reference: np.ndarray, folder: Path, limit: float, on: str) -> Exports:
    """ONNX + TorchScript files of `model` in `folder`, each run on `x` against `reference` (PyTorch's
    outputs on it); prints the parity. ExportError when an export fails or ONNX differs by more than `limit`."""
    from hpolab.registry.export import ExportError, export_onnx, export_torchscript, onnx_max_abs_diff, torchscript_max_abs_diff

    onnx_path, exporter = export_onnx(model, example, folder / "model.onnx")
    onnx_diff = onnx_max_abs_diff(onnx_path, x, reference)
    ts_path = export_torchscript(model, example, folder / "model.torchscript.pt")
    ts_diff = torchscript_max_abs_diff(ts_path, x, reference)
    print(f"exports: ONNX ({exporter} exporter) max abs diff vs PyTorch {onnx_diff:.3g} on {on} "
          f"(limit {limit:.3g}); TorchScript {ts_diff:.3g}")
    if not onnx_diff <= limit:
        raise ExportError(f"ONNX parity: ONNX Runtime's outputs differ from PyTorch's by up to {onnx_diff:.3g} on {on} "
                          f"(limit {limit:.3g})")
    return Exports(onnx_path, ts_path, exporter, onnx_diff, ts_diff)
