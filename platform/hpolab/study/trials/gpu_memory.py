"""A trial process's GPU memory, for its run's system metrics (system_metrics.py reads the file).

torch's allocator counts only this process's tensors, and only this process can ask it; so a CUDA
trial writes, every INTERVAL_S from a daemon thread, what `torch.cuda.memory_allocated` and
`max_memory_allocated` say (and, with nvidia-ml-py installed, `torch.cuda.utilization`) to a small
file in its trial folder. Nothing is written while CUDA is not initialized (a CPU trial never is):
the thread never creates a CUDA context itself.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from hpolab.study.trials.system_metrics import GPU_FILE, INTERVAL_S


def gpu_memory_now(torch) -> dict[str, float]:
    """This process's use of its first visible GPU, as system_metrics' keys (without "system/")."""
    if not torch.cuda.is_initialized():
        return {}
    total = torch.cuda.get_device_properties(0).total_memory
    used = torch.cuda.memory_allocated(0)
    out = {"gpu_0_memory_usage_megabytes": round(used / 1e6, 1), "gpu_0_memory_usage_percentage": round(used / total * 100, 2),
           "peak_gpu_0_memory_megabytes": round(torch.cuda.max_memory_allocated(0) / 1e6, 1)}
    try:
        out["gpu_0_utilization_percentage"] = float(torch.cuda.utilization(0))  # (needs NVML: nvidia-ml-py)
    except Exception:
        pass
    return out


def watch_gpu_memory(trial_dir: str, interval: float = INTERVAL_S) -> None:
    """Start the writer thread of this trial process (a daemon: it ends with the process)."""
    import torch

    path = Path(trial_dir) / GPU_FILE
    path.unlink(missing_ok=True)  # (a retry in the same folder: not the previous attempt's figures)
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            values = gpu_memory_now(torch)
            if values:
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                try:
                    tmp.write_text(json.dumps(values))
                    os.replace(tmp, path)  # (the driver never reads half a file)
                except OSError:
                    return

    threading.Thread(target=loop, name="gpu-memory", daemon=True).start()
