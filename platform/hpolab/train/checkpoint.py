"""Checkpoints: atomic writes, weights-only loads, strict model-state loading.

A checkpoint is a dict of plain data and tensors (state_dicts, never pickled objects), so
`torch.load(weights_only=True)` reads it: loading one runs no code. Every loop writes the same
layout (fit() here; an own loop's trial.checkpoint through study/trials/trial.py), `last.pt` after an
epoch and `best.pt` for the best one; `best.pt` is a hard link to that epoch's `last.pt` (one write
and fsync for both): every write of last.pt is a new file (atomic_write_bytes: a temporary file
renamed over it), so the link keeps that epoch's state.

    format_version   int, CHECKPOINT_FORMAT
    epoch            last completed epoch, as recorded (1-based; a resume continues at epoch + 1)
    history          list of per-epoch metric dicts (incl. "epoch")
    metric, direction      what the best epoch is picked by
    best_value, best_epoch the best metric so far and its epoch (best.pt holds that epoch's state)
    epoch_base       how the loop counts its epochs (0 or 1; None: from 1, as fit does)
    config           the config it trained with (fit alone: {"trainer": dataclasses.asdict(TrainConfig)})
    state            the loop's own state. fit's:
        model            state_dict of the uncompiled module (no "_orig_mod." prefix)
        optimizer        optimizer.state_dict();  scheduler: LRSchedule.state_dict()
        scaler           GradScaler.state_dict() under fp16, else None
        global_step      optimizer steps so far;  micro_step: micro-batches (forward passes) so far
        early_stopping   {"best": value early stopping compares against, "bad_epochs": epochs without
                         an improvement larger than min_delta}
        rng              seeding.capture_rng_state(): python, numpy, torch, cuda (list), generator
        amp, device, torch_version   facts about the run that wrote it
      an own loop's: the dict it gave trial.checkpoint.

Files of the two earlier layouts (fit's format 1 with its state at the top, an own loop's "own_loop": 1)
are read as this one (load_checkpoint): a study paused or interrupted before an upgrade resumes.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

CHECKPOINT_FORMAT = 2
RECORD = ("epoch", "history", "metric", "direction", "best_value", "best_epoch")  # every loop's, at the top
COMPILED_PREFIX = "_orig_mod."  # what torch.compile's OptimizedModule puts in front of every key


class StateDictMismatchError(RuntimeError):
    """A state_dict that does not fit the model; `missing` and `unexpected` name the keys."""

    def __init__(self, message: str, missing: Sequence[str] = (), unexpected: Sequence[str] = ()):
        super().__init__(message)
        self.missing = list(missing)
        self.unexpected = list(unexpected)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module under a torch.compile wrapper (its state_dict has the plain key names)."""
    return getattr(model, "_orig_mod", model)


def _fsync_dir(directory: Path) -> None:
    # Make the rename itself durable. Not possible on every platform/filesystem (e.g. Windows).
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(data: bytes, path: str | Path) -> Path:
    """Write `data` to `path` so that a crash at any point leaves either the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The temporary file is in the same directory: os.replace is atomic only within one filesystem.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def link_or_write(data: bytes, source: Path, path: str | Path) -> Path:
    """`path` as another name of `source`, a file just written with `data` by atomic_write_bytes (a
    hard link put in place atomically: no second write and fsync). `source` must never be written in
    place, or `path` would change with it: atomic_write_bytes replaces it with a new file. Where the
    filesystem has no hard links (os.link raises OSError), `data` is written to `path` instead."""
    path = Path(path)
    link = path.with_name(f".{path.name}.{os.getpid()}.link")
    try:
        link.unlink(missing_ok=True)  # (one a crash left)
        os.link(source, link)
    except OSError:
        return atomic_write_bytes(data, path)
    # A crash before the next atomic_write_bytes syncs the directory leaves the previous `path`, whole.
    os.replace(link, path)
    return path


def serialize_checkpoint(state: Mapping[str, Any]) -> bytes:
    """torch.save into memory: one serialization can then be written to last.pt and best.pt."""
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    return buffer.getvalue()


def save_checkpoint(state: Mapping[str, Any], path: str | Path) -> Path:
    """Serialize `state` and write it to `path` atomically (see `atomic_write_bytes`)."""
    return atomic_write_bytes(serialize_checkpoint(state), path)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint as data only (weights_only=True: no code runs on load)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return _upgraded(torch.load(path, map_location=map_location, weights_only=True))


def _upgraded(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint of an earlier layout in this one (the module docstring); others as they are."""
    if ckpt.get("own_loop") == 1:  # an own loop's: its record at the top, its state under "state" already
        return {**{k: v for k, v in ckpt.items() if k != "own_loop"}, "format_version": CHECKPOINT_FORMAT}
    if ckpt.get("format_version") == 1:  # fit's: everything at the top, config the trainer's
        top = {k: ckpt[k] for k in RECORD if k in ckpt}
        state = {k: v for k, v in ckpt.items() if k not in RECORD and k not in ("format_version", "config")}
        return {**top, "format_version": CHECKPOINT_FORMAT, "epoch_base": None, "config": {"trainer": ckpt.get("config")},
                "state": state}
    return ckpt


def load_model_state(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """load_state_dict(strict=True), with a readable report of missing/unexpected keys.

    Accepts state_dicts written from a torch.compile'd module ("_orig_mod." prefix) and loads into
    compiled or plain modules alike.
    """
    target = unwrap_model(model)
    if any(k.startswith(COMPILED_PREFIX) for k in state_dict):
        state_dict = {k.removeprefix(COMPILED_PREFIX): v for k, v in state_dict.items()}
    expected = set(target.state_dict().keys())
    given = set(state_dict.keys())
    missing, unexpected = sorted(expected - given), sorted(given - expected)
    if missing or unexpected:
        lines = ["the state_dict does not match the model (was the model built with the same settings?)"]
        if missing:
            lines.append(f"  missing keys ({len(missing)}): {', '.join(missing)}")
        if unexpected:
            lines.append(f"  unexpected keys ({len(unexpected)}): {', '.join(unexpected)}")
        raise StateDictMismatchError("\n".join(lines), missing, unexpected)
    try:
        target.load_state_dict(state_dict, strict=True)
    except RuntimeError as e:  # same keys, different shapes
        raise StateDictMismatchError(f"the state_dict does not fit the model: {e}") from e
