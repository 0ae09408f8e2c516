"""Seeding, determinism switches and RNG state capture/restore (for exact resume).

Every random stream a trial touches is covered: python `random`, numpy's global RNG, torch's CPU
generator and every CUDA device's generator, DataLoader workers (via `seed_worker`), and an explicit
`torch.Generator` that drives shuffling and sampling -- kept separate from the global stream so that
model code drawing random numbers (dropout, augmentation) does not change the data order.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

# cuBLAS needs a fixed workspace to be deterministic on CUDA >= 10.2. ":4096:8" is the documented
# value (8 buffers of 4 MiB); it must be set before the first cuBLAS call in the process.
_CUBLAS_WORKSPACE = ":4096:8"


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (CPU + all CUDA devices) and set the determinism switches.

    deterministic=True: cudnn.deterministic, no cudnn autotuning, and
    torch.use_deterministic_algorithms(True) -- an op without a deterministic implementation then
    raises instead of silently varying. deterministic=False: cudnn.benchmark=True (autotuned
    convolution kernels, faster, run-to-run variation in the last bits on CUDA).
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)  # numpy's legacy seed must fit in 32 bits
    torch.manual_seed(seed)  # also seeds every CUDA device (lazily, no CUDA init)
    torch.cuda.manual_seed_all(seed)
    if deterministic and torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_WORKSPACE)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    # use_deterministic_algorithms imports torch._inductor (seconds); only call it when the
    # setting actually changes, so a non-deterministic trial starts in milliseconds.
    if torch.are_deterministic_algorithms_enabled() != deterministic:
        torch.use_deterministic_algorithms(deterministic)


def make_generator(seed: int) -> torch.Generator:
    """The CPU generator that drives shuffling and weighted sampling of the train split.

    Kept on the CPU whatever the training device: the permutation is then the same on every
    machine, and its state is a small ByteTensor that goes into the checkpoint.
    """
    return torch.Generator(device="cpu").manual_seed(seed)


def seed_worker(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: seed numpy and python in each worker from torch's worker seed.

    The DataLoader already gives each worker a distinct torch seed (base seed drawn from the
    loader's generator + worker id); numpy/python-based transforms would otherwise all start from
    the parent's state and produce identical "random" augmentations in every worker.
    """
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


def capture_rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    """All RNG states as plain data (loadable with torch.load(weights_only=True))."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),  # (version, tuple of 625 ints, None | float)
        # numpy's state holds a uint32 ndarray; store it as a list of ints (an ndarray is not
        # loadable with weights_only=True).
        "numpy": {
            "name": np_state[0],
            "keys": np_state[1].tolist(),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
        # Only read CUDA states once CUDA is in use: get_rng_state_all() would initialize CUDA.
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
        "generator": generator.get_state() if generator is not None else None,
    }
    return state


def restore_rng_state(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    """Inverse of `capture_rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    npst = state["numpy"]
    np.random.set_state(
        (npst["name"], np.asarray(npst["keys"], dtype=np.uint32), npst["pos"], npst["has_gauss"], npst["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    cuda_states = state.get("cuda") or []
    if cuda_states and torch.cuda.is_available():
        # A resume on a machine with a different GPU count restores the devices both have.
        for index in range(min(len(cuda_states), torch.cuda.device_count())):
            torch.cuda.set_rng_state(cuda_states[index], index)
    if generator is not None and state.get("generator") is not None:
        generator.set_state(state["generator"])
