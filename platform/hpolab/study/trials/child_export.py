"""A trial's model saved by its own process, after its last epoch, while the next trial starts.

Exporting a model (torch.export for MLflow's "pt2" format, a few tenths of a second warm, seconds
cold) used to run on the driver's upload thread, where it competed with the next trial for the
CPU and with the driver's loop for the GIL. The trial process already has torch warm and the
experiment imported, so it does the work itself:

    child -> driver                  driver -> child
    ("done", summary)                "export" | "skip"   (the driver's retention decides: log_models)
    ("model", path) | ("model_error", reason)

The driver frees the trial's slot at "done" (the next trial starts at once) and only logs the saved
folder (stores/models.log_saved_model); it still exports from the checkpoint itself when the child
could not (it died, or this is a DDP trial). The forkserver preloads export_warm.py when the spec
logs models, so every trial is forked with MLflow imported and torch.export initialised.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

MODEL_DIR = "model"  # the saved MLflow model, in the trial's folder, until the driver has logged it


def warm() -> None:
    """One throwaway save and load of a tiny model: MLflow's imports and torch.export's first-call
    set-up (seconds) happen once, in the forkserver, not in every trial.

    On one thread: torch's OpenMP pool must not start in the forkserver (a fork of a process with
    a running libgomp pool hangs the first time the child computes in parallel)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _save_and_load_a_tiny_model()
    finally:
        torch.set_num_threads(threads)


def _save_and_load_a_tiny_model() -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, padding=1), torch.nn.BatchNorm2d(2), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Dropout(0.1), torch.nn.Linear(8, 2)).eval()
    example = torch.zeros(2, 1, 2, 2)
    with torch.inference_mode():
        output = model(example)
    with tempfile.TemporaryDirectory() as tmp:
        save_model(model, Path(tmp) / "m", example.numpy(), output.numpy(), ["torch"])


def save_model(model, path: Path, input_example: np.ndarray, output_example: np.ndarray, requirements: list[str]) -> None:
    """mlflow.pytorch.save_model with signature and example, then load it back with pyfunc and
    predict on the example: the check `log_model` makes (the driver then logs without repeating it)."""
    import mlflow.pyfunc
    import mlflow.pytorch
    from mlflow.models import infer_signature

    mlflow.pytorch.save_model(model, str(path), input_example=input_example,
                              signature=infer_signature(input_example, output_example), pip_requirements=requirements)
    mlflow.pyfunc.load_model(str(path)).predict(input_example)


def save_model_folder(model, trial_dir: Path, input_example: np.ndarray, output_example: np.ndarray) -> Path:
    """`model` as the MLflow model folder `trial_dir`/model (written under a temporary name, then
    renamed), with the installed versions as its requirements. Returns its path."""
    from hpolab.stores.models import pip_requirements

    final = trial_dir / MODEL_DIR
    partial = Path(tempfile.mkdtemp(prefix=".model-", dir=trial_dir))
    try:
        save_model(model, partial / MODEL_DIR, input_example, output_example, pip_requirements({}))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial / MODEL_DIR, final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final


def offer_export(conn, job: dict[str, Any], summary: dict[str, Any] | None, save: Callable[[Path], Path]) -> None:
    """After ("done", summary): wait for the driver's decision and save the model if it asks.

    Only a trial whose job says `export_model` (the spec logs models) waits; the driver then always
    answers or closes the pipe, and the lifeline ends this process if the driver dies meanwhile.
    `save(trial_dir)` saves this trial's model (the copy trial.log_model kept: trial.py) there."""
    if not job.get("export_model") or summary is None:
        return
    _free_gpu_memory()  # the next trial may be starting on the same GPU while this one saves
    import torch

    # Tracing is single-threaded Python and the example's forward passes are tiny: one thread, so
    # this process's OpenMP pool does not contend for the cores with the next trial's training.
    torch.set_num_threads(1)
    try:
        if conn.recv() != "export":
            return
    except (EOFError, OSError):
        return
    try:
        message: tuple = ("model", str(save(Path(job["checkpoint_dir"]))))
    except Exception as e:  # the driver exports from the checkpoint itself, and records the error if that fails too
        message = ("model_error", f"{type(e).__name__}: {e}")
    try:
        conn.send(message)
    except (EOFError, OSError):
        pass


def _free_gpu_memory() -> None:
    """Return what training cached on the GPU (its model and optimizer are gone with fit()); the model
    is saved from its checkpoint on the CPU. Its CUDA context stays until the process exits."""
    import gc

    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


# The driver's side --------------------------------------------------------------------------------

# How long the driver waits for a trial process to save its model. Generous: a large model exports
# slowly on a busy CPU; a process that dies is noticed at once (its pipe closes).
SAVE_WAIT_S = 900.0


def answer_child(conn, lifeline, export: bool) -> tuple | None:
    """Tell a waiting trial process whether to save its model. Returns its (conn, lifeline) for
    receive_model when it was told to; otherwise closes them (it exits)."""
    try:
        conn.send("export" if export else "skip")
    except (EOFError, OSError):  # it is gone: the driver exports from the checkpoint
        export = False
    if export:
        return conn, lifeline
    _close(conn, lifeline)
    return None


def receive_model(conn, lifeline, on_problem, wait_s: float = SAVE_WAIT_S,
                  then: str = "exporting it from its checkpoint here") -> str | None:
    """The folder the trial process saved, or None (with `on_problem` told why, and `then` what
    happens instead) when it could not; then closes its pipes (the process exits)."""
    import time

    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            if conn.poll(1.0):
                kind, detail = conn.recv()
                if kind == "model":
                    return detail
                on_problem(f"its process could not save the model ({detail}); {then}")
                return None
        on_problem(f"its process did not save the model within {wait_s:g} s; {then}")
    except (EOFError, OSError):
        on_problem(f"its process ended before saving the model; {then}")
    finally:
        _close(conn, lifeline)
    return None


def _close(*handles) -> None:
    for h in handles:
        try:
            h.close()
        except OSError:
            pass
