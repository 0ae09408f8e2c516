"""`hpolab env`: check an install the way practitioners do (the design's practices, 'Environment and reproducibility')."""

from __future__ import annotations

import shutil
import time

from rich.console import Console
from rich.table import Table

from hpolab.stores.environment import capture_environment


def run_env_check() -> int:
    import torch

    console = Console(highlight=False)
    env = capture_environment()
    table = Table(title="hpolab environment", show_header=False)
    for k, v in env.items():
        table.add_row(k.removeprefix("env."), v)
    console.print(table)

    ok = True
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        a = torch.randn(512, 512, device=device)
        t = time.perf_counter()
        b = a @ a
        if device == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1000
        finite = bool(torch.isfinite(b).all())
        console.print(f"matmul 512x512 on {device}: {'ok' if finite else 'NON-FINITE RESULT'} ({ms:.1f} ms)")
        ok &= finite
    except Exception as e:  # a broken CUDA install shows up here
        console.print(f"[red]matmul on {device} failed: {type(e).__name__}: {e}[/]")
        ok = False

    if torch.cuda.is_available():
        console.print(f"CUDA available: {torch.cuda.device_count()} device(s); cuDNN {torch.backends.cudnn.version()}; bf16 supported: {torch.cuda.is_bf16_supported()}")
    elif shutil.which("nvidia-smi"):
        if torch.version.cuda is None:
            console.print("[red]this machine has an NVIDIA GPU (nvidia-smi found) but a CPU-only torch is installed: install a CUDA build of torch[/]")
        else:
            console.print(f"[red]nvidia-smi is present and torch was built for CUDA {torch.version.cuda}, but CUDA is not available: check the driver version[/]")
        ok = False
    else:
        console.print("no GPU found: trials run on the CPU" + (f" (torch is a CUDA {torch.version.cuda} build)" if torch.version.cuda else ""))
    return 0 if ok else 1
