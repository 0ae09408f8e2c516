"""Which device a trial trains on, and which mixed-precision mode it uses there.

amp modes: "off" (fp32), "bf16" (autocast to bfloat16, no loss scaling needed: bf16 has fp32's
exponent range), "fp16" (autocast to float16 + GradScaler, CUDA only: fp16 gradients underflow
without loss scaling).
"""

from __future__ import annotations

import contextlib

import torch


def resolve_device(requested: str) -> torch.device:
    """"auto" -> the current CUDA device when there is one, else the CPU.

    "cuda" means the process's current CUDA device; the driver picks the physical GPU through
    CUDA_VISIBLE_DEVICES, so inside a trial that is always index 0 of what is visible.
    """
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                "device='cuda' but torch.cuda.is_available() is False (no GPU visible, or a CPU-only torch build); "
                "use device='auto' or 'cpu'"
            )
        return torch.device("cuda", torch.cuda.current_device())
    if requested == "cpu":
        return torch.device("cpu")
    raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {requested!r}")


def _cuda_bf16_native() -> bool:
    # `including_emulation` (torch >= 2.3) would report True on pre-Ampere GPUs, where bf16 runs
    # emulated and slower than fp16; auto should pick fp16 there.
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # older torch without the keyword
        return torch.cuda.is_bf16_supported()


def resolve_amp(requested: str, device: torch.device) -> str:
    """Turn the configured amp mode into the one that will run: "off", "bf16" or "fp16".

    auto: bf16 on CUDA if the GPU supports it natively, fp16 on older CUDA GPUs, off on the CPU
    (CPU autocast is opt-in: ask for amp="bf16" explicitly).
    """
    if requested == "off":
        return "off"
    if device.type == "cuda":
        if requested == "auto":
            return "bf16" if _cuda_bf16_native() else "fp16"
        if requested == "bf16" and not torch.cuda.is_bf16_supported():
            raise ValueError("amp='bf16' but this GPU does not support bfloat16; use amp='fp16' or 'auto'")
        if requested in ("bf16", "fp16"):
            return requested
    elif device.type == "cpu":
        if requested == "auto":
            return "off"
        if requested == "bf16":
            return "bf16"
        if requested == "fp16":
            raise ValueError("amp='fp16' needs CUDA (it relies on GradScaler); on the CPU use amp='bf16' or 'off'")
    else:
        if requested == "auto":
            return "off"
        raise ValueError(f"amp={requested!r} is only supported on cuda and cpu devices, not {device.type}; use amp='off'")
    raise ValueError(f"amp must be 'auto', 'bf16', 'fp16' or 'off', got {requested!r}")


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager:
    """The autocast context for a resolved amp mode (a no-op context for "off")."""
    if amp == "off":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_grad_scaler(amp: str) -> torch.amp.GradScaler:
    """Loss scaler: active under fp16 only; disabled (every method a pass-through) otherwise."""
    return torch.amp.GradScaler("cuda", enabled=(amp == "fp16"))


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work -- only at epoch boundaries, so the timings are wall-clock true."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
