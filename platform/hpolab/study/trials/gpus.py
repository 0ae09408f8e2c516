"""Which physical GPUs a trial gets: its indices among the driver's GPUs, mapped through the mask.

The driver counts the GPUs it can see (`torch.cuda.device_count()`, which honours the driver's own
CUDA_VISIBLE_DEVICES) and gives each trial an index among them. A trial's process must then be told
the *physical* device: under Slurm, Kubernetes or a shared workstation the driver sees
CUDA_VISIBLE_DEVICES=2,3, and writing index 0 raw into the child would put the trial on physical
GPU 0, which belongs to someone else. Entries of the mask are kept as the driver's strings, so UUID
(GPU-8f3c...) and MIG (MIG-...) masks pass through unchanged.
"""

from __future__ import annotations

from typing import Sequence


def visible_entries(visible_env: str | None) -> list[str] | None:
    """The entries of a CUDA_VISIBLE_DEVICES value, or None when it is unset (every GPU visible)."""
    if visible_env is None:
        return None
    return [e.strip() for e in visible_env.split(",") if e.strip()]


def physical_devices(visible_env: str | None, indices: Sequence[int]) -> str | None:
    """The CUDA_VISIBLE_DEVICES value for a child that should use the driver's GPUs `indices`.

    `visible_env` is the driver's own CUDA_VISIBLE_DEVICES (None when unset). Returns None when
    `indices` is empty (no GPU for the child: leave its environment as inherited).
    """
    if not indices:
        return None
    entries = visible_entries(visible_env)
    if entries is None:
        return ",".join(str(i) for i in indices)
    out = []
    for i in indices:
        if not 0 <= i < len(entries):
            raise ValueError(f"GPU index {i} is outside CUDA_VISIBLE_DEVICES={visible_env!r} "
                             f"({len(entries)} visible)")
        out.append(entries[i])
    return ",".join(out)


def trial_indices(first: int | None, devices: int, n_gpus: int) -> list[int]:
    """A trial's GPU indices: its own `first`, and with trainer.devices=N the N-1 after it (wrapping)."""
    if first is None or n_gpus <= 0:
        return []
    return [(first + k) % n_gpus for k in range(max(1, min(devices, n_gpus)))]
