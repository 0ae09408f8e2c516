"""Export the serving model to ONNX (dynamic batch axis) and TorchScript, and check both against PyTorch.

The parity check runs the exported file on real inputs (the raw test split), not on random noise:
max |exported - pytorch| over every logit. ONNX must stay within ONNX_TOLERANCE, else promotion
fails (a deployed ONNX model that disagrees with the validated PyTorch one is not the model we tested).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

ONNX_TOLERANCE = 1e-4  # max abs difference of logits, ONNX Runtime vs PyTorch (float32 CPU)
INPUT_NAME, OUTPUT_NAME = "raw", "logits"
ORT_BATCH = 512
TORCHSCRIPT_CHECK_ROWS = 1024


class ExportError(RuntimeError):
    """An export or its parity check failed; the message says which and why."""


@contextlib.contextmanager
def _quiet():
    # The exporters narrate (progress lines, deprecation and tracer warnings about code we export on
    # purpose, e.g. torch.as_tensor in a preprocess function); the promote output is ours.
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


EXPORTERS = ("torchscript", "dynamo")  # tried in this order


def export_onnx(model: nn.Module, example: torch.Tensor, path: str | Path, exporters: tuple[str, ...] = EXPORTERS) -> tuple[Path, str]:
    """ONNX with a dynamic batch axis; returns (path, the exporter that made it).

    The TorchScript-based exporter first: present through torch 2.14 (deprecated since 2.9) and
    seconds faster for these small graphs. Where it is gone or fails, the torch.export-based one
    (torch's default since 2.9, needs onnxscript). The parity check judges either result.
    """
    path = Path(path)
    model.eval()
    errors = []
    for exporter in exporters:
        try:
            with _quiet():
                if exporter == "torchscript":
                    torch.onnx.export(
                        model,
                        (example,),
                        str(path),
                        dynamo=False,
                        input_names=[INPUT_NAME],
                        output_names=[OUTPUT_NAME],
                        dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                    )
                else:
                    program = torch.onnx.export(
                        model,
                        (example,),
                        dynamo=True,
                        input_names=[INPUT_NAME],
                        output_names=[OUTPUT_NAME],
                        dynamic_shapes=({0: torch.export.Dim("batch")},),
                        external_data=False,  # one self-contained file (fine below 2 GB of weights)
                        verbose=False,
                    )
                    program.save(str(path))
            return path, exporter
        except Exception as e:  # noqa: BLE001 -- try the next exporter; report all if none works
            errors.append(f"{exporter} exporter: {type(e).__name__}: {e}")
    raise ExportError("ONNX export failed:\n  " + "\n  ".join(errors))


def onnx_max_abs_diff(path: str | Path, x: np.ndarray, reference: np.ndarray) -> float:
    """Run the ONNX file with ONNX Runtime (CPU) on `x` in batches; max |logits - reference|."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only
    session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    worst = 0.0
    # Batches of different sizes (incl. a last partial one) also exercise the dynamic batch axis.
    for lo in range(0, len(x), ORT_BATCH):
        out = session.run(None, {name: np.ascontiguousarray(x[lo : lo + ORT_BATCH])})[0]
        ref = reference[lo : lo + ORT_BATCH]
        if out.shape != ref.shape:
            raise ExportError(f"ONNX output shape {out.shape} != PyTorch's {ref.shape}")
        worst = max(worst, float(np.max(np.abs(out.astype(np.float64) - ref.astype(np.float64)))))
    if not np.isfinite(worst):
        raise ExportError("ONNX outputs are not finite")
    return worst


def export_torchscript(model: nn.Module, example: torch.Tensor, path: str | Path) -> Path:
    """TorchScript by tracing (deprecated in torch >= 2.10, still the most widely loadable artifact:
    C++ libtorch, Triton's pytorch backend)."""
    path = Path(path)
    model.eval()
    try:
        with _quiet(), torch.no_grad():
            traced = torch.jit.trace(model, (example,), check_trace=False)
            torch.jit.save(traced, str(path))
    except Exception as e:  # noqa: BLE001 -- e.g. a preprocess that cannot be traced
        raise ExportError(f"TorchScript export failed: {type(e).__name__}: {e}") from e
    return path


def torchscript_max_abs_diff(path: str | Path, x: np.ndarray, reference: np.ndarray, limit: int = TORCHSCRIPT_CHECK_ROWS) -> float:
    """Max |TorchScript - reference| on the first `limit` inputs (TorchScript runs the same aten
    kernels as eager PyTorch: a sample shows a broken trace; the full split would only cost time)."""
    with _quiet():
        loaded = torch.jit.load(str(path), map_location="cpu")
    loaded.eval()
    x, reference = x[:limit], reference[:limit]
    worst = 0.0
    batch_size = ORT_BATCH
    with torch.inference_mode():
        for lo in range(0, len(x), batch_size):
            out = loaded(torch.from_numpy(np.ascontiguousarray(x[lo : lo + batch_size]))).float().numpy()
            worst = max(worst, float(np.max(np.abs(out.astype(np.float64) - reference[lo : lo + batch_size].astype(np.float64)))))
    return worst
