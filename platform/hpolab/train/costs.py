"""Cost metrics of a trained model (config/objectives.py COST_METRICS): a second objective or a
constraint without user code. Measured once, in the trial process, after training.

latency_ms is the median of timed batch-1 forward passes in eval mode without autograd, after
warm-up passes (first calls pay for allocation, cuDNN autotuning and lazy init), on the trial's
device, synchronising CUDA around each pass so the time is the kernel's, not the launch's.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

WARMUP = 5
TIMED = 30
BUILT_IN = ("params", "model_mb", "latency_ms")  # = config/objectives.py COST_METRICS (a test checks)


def trainable_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def model_mb(model: nn.Module) -> float:
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def latency_ms(model: nn.Module, example: torch.Tensor, device: torch.device) -> float:
    """Median batch-1 inference time in milliseconds; `example`: one input with a batch dimension."""
    was_training = model.training
    model.eval()
    x = example[:1].to(device)
    cuda = device.type == "cuda"
    times = []
    with torch.inference_mode():
        for i in range(WARMUP + TIMED):
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            model(x)
            if cuda:
                torch.cuda.synchronize(device)
            if i >= WARMUP:
                times.append((time.perf_counter() - start) * 1000.0)
    model.train(was_training)
    return statistics.median(times)


def cost_metrics(names: list[str], model: nn.Module, example: torch.Tensor, device: torch.device,
                 own=None) -> dict[str, float]:
    """The asked-for cost metrics of `model` (on `device`). `own`: the experiment's costs(model,
    example) function, for the names that are not built in (config/objectives.py COSTS)."""
    out: dict[str, float] = {}
    theirs = [n for n in names if n not in BUILT_IN]
    if theirs:
        out.update(own_costs(theirs, own, model, example.to(device)))
    if "params" in names:
        out["params"] = float(trainable_params(model))
    if "model_mb" in names:
        out["model_mb"] = model_mb(model)
    if "latency_ms" in names:
        out["latency_ms"] = latency_ms(model, example, device)
    return out


def own_costs(names: list[str], own, model: nn.Module, example: torch.Tensor) -> dict[str, float]:
    """The experiment's own cost metrics, measured by its costs(model, example) in eval mode without
    autograd; a missing or non-numeric value fails the trial with the name (not a silent NaN)."""
    if own is None:
        raise ValueError(f"the experiment has no costs(model, example) function to measure {', '.join(names)}")
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            got = own(model, example)
    finally:
        model.train(was_training)
    out = {}
    for n in names:
        v = got.get(n) if isinstance(got, dict) else None
        try:
            out[n] = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"the experiment's costs(model, example) returned {v!r} for {n!r} "
                             f"(declared in its COSTS); return a number for each of {', '.join(names)}") from None
    return out
