"""What fit() carries from one epoch to the next, and how a checkpoint saves and restores it.

The loop state (history, step counters, best and early-stopping values) is a small dataclass; the
rest of a run's state lives in the objects that own it (model, optimizer, LR schedule, GradScaler,
the train split's generator, the global RNGs) and is read from / written to them here. The keys are
listed in checkpoint.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from .checkpoint import CHECKPOINT_FORMAT, atomic_write_bytes, link_or_write, load_checkpoint, load_model_state, serialize_checkpoint
from .config import TrainConfig
from .optim import LRSchedule, take_group_settings
from .seeding import capture_rng_state, restore_rng_state


def better(value: float, reference: float, direction: str, min_delta: float = 0.0) -> bool:
    """Whether `value` improves on `reference` by more than min_delta (a nan reference: anything finite does)."""
    if not math.isfinite(value):
        return False
    if math.isnan(reference):
        return True
    if direction == "maximize":
        return value > reference + min_delta
    return value < reference - min_delta


@dataclass
class LoopState:
    epoch: int = 0  # last completed epoch (1-based; 0 before the first), counting those before a resume
    global_step: int = 0  # optimizer steps since the start of training
    micro_step: int = 0  # forward/backward passes since the start of training
    history: list[dict[str, float]] = field(default_factory=list)  # per-epoch metrics, each with "epoch"
    best_value: float = math.nan  # best value of the study metric so far (any strict improvement)
    best_epoch: int = 0  # its epoch; 0 when none
    es_reference: float = math.nan  # early stopping: the value to beat by more than min_delta
    bad_epochs: int = 0  # epochs in a row without such an improvement

    def record(self, epoch: int, metrics: dict[str, float], value: float, direction: str, min_delta: float) -> bool:
        """Add an epoch's metrics (`value`: its study metric); returns whether it is a new best."""
        improved = better(value, self.best_value, direction)
        if improved:
            self.best_value, self.best_epoch = value, epoch
        if better(value, self.es_reference, direction, min_delta):
            self.es_reference, self.bad_epochs = value, 0
        else:
            self.bad_epochs += 1
        self.history.append({"epoch": epoch, **metrics})
        self.epoch = epoch
        return improved


@dataclass(frozen=True)
class Checkpointed:
    """The run's objects whose state a checkpoint holds besides LoopState (read and written in place)."""

    model: nn.Module  # the plain module (state_dict keys without torch.compile's prefix)
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    scaler: torch.amp.GradScaler
    generator: torch.Generator  # the train split's order; the global RNGs are saved too


def write_checkpoints(
    state: LoopState,
    parts: Checkpointed,
    directory: Path,
    *,
    improved: bool,
    cfg: TrainConfig,
    metric: str,
    direction: str,
    amp: str,
    device: torch.device,
) -> tuple[Path, Path | None]:
    """last.pt (and best.pt when `improved`: the same file under a second name, checkpoint.py)
    after epoch `state.epoch`; returns (last, best or None)."""
    blob = serialize_checkpoint(
        {
            "format_version": CHECKPOINT_FORMAT,  # the layout every loop writes (checkpoint.py)
            "epoch": state.epoch,
            "history": state.history,
            "metric": metric,
            "direction": direction,
            "best_value": state.best_value,
            "best_epoch": state.best_epoch,
            "epoch_base": None,  # (fit counts from 1)
            "config": {"trainer": dataclasses.asdict(cfg)},
            "state": {
                "model": parts.model.state_dict(),
                "optimizer": parts.optimizer.state_dict(),
                "scheduler": parts.schedule.state_dict(),
                "scaler": parts.scaler.state_dict() if parts.scaler.is_enabled() else None,
                "global_step": state.global_step,
                "micro_step": state.micro_step,
                "early_stopping": {"best": state.es_reference, "bad_epochs": state.bad_epochs},
                "rng": capture_rng_state(parts.generator),
                "amp": amp,
                "device": str(device),
                "torch_version": str(torch.__version__),  # TorchVersion is not weights_only-loadable
            },
        }
    )
    last = atomic_write_bytes(blob, directory / "last.pt")
    best = link_or_write(blob, last, directory / "best.pt") if improved else None
    return last, best


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    def norm(v):
        return list(v) if isinstance(v, tuple) else v

    keys = sorted(set(saved) | set(current))
    return [f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in keys if norm(saved.get(k)) != norm(current.get(k))]


def restore(
    path: str | Path,
    parts: Checkpointed,
    *,
    cfg: TrainConfig,
    metric: str,
    direction: str,
    checkpoint_dir: Path | None,
    note: Callable[[str], None],
    loaded: dict[str, Any] | None = None,
) -> tuple[LoopState, Path | None]:
    """Load a last.pt into the run's objects and the RNGs; returns its loop state and the best.pt beside it.
    `loaded`: the file's contents as load_checkpoint read them already (a trial object's), not read again.

    The RNG states are restored last: nothing after this may draw random numbers before training.
    """
    ckpt = loaded if loaded is not None else load_checkpoint(path, map_location="cpu")
    own = ckpt.get("state") if isinstance(ckpt.get("state"), dict) else {}
    if ckpt.get("format_version") != CHECKPOINT_FORMAT or "rng" not in own:
        raise ValueError(f"{path} was not written by fit() (checkpoint format {ckpt.get('format_version')!r}, expected "
                         f"{CHECKPOINT_FORMAT} with the routine's state): an own loop's, or not hpolab's")
    saved_cfg = (ckpt.get("config") or {}).get("trainer") or {}
    if ckpt["metric"] != metric or ckpt["direction"] != direction:
        raise ValueError(
            f"{path} tracked {ckpt['metric']} ({ckpt['direction']}); resume with the same metric and "
            f"direction, not {metric} ({direction})"
        )
    load_model_state(parts.model, own["model"])
    parts.optimizer.load_state_dict(own["optimizer"])
    parts.schedule.load_state_dict(own["scheduler"])
    # The checkpoint's optimizer settings are replaced by the config's (PBT changes them between segments);
    # loading restored the saved ones along with the moments, which stay.
    take_group_settings(parts.optimizer, cfg)
    parts.schedule.take_new_lr(cfg.lr, float(saved_cfg["lr"]), parts.optimizer)
    if parts.scaler.is_enabled() and own.get("scaler"):
        parts.scaler.load_state_dict(own["scaler"])
    state = LoopState(
        epoch=int(ckpt["epoch"]),
        global_step=int(own["global_step"]),
        micro_step=int(own["micro_step"]),
        history=[dict(h) for h in ckpt["history"]],
        best_value=float(ckpt["best_value"]),
        best_epoch=int(ckpt["best_epoch"]),
        es_reference=float(own["early_stopping"]["best"]),
        bad_epochs=int(own["early_stopping"]["bad_epochs"]),
    )
    diffs = config_differences(saved_cfg, dataclasses.asdict(cfg))
    if diffs:
        note("config differs from the checkpoint's (resume is exact only with the same config): " + "; ".join(diffs))
    best_path = None
    for candidate in ([checkpoint_dir / "best.pt"] if checkpoint_dir else []) + [Path(path).parent / "best.pt"]:
        if state.best_epoch and candidate.is_file():
            best_path = candidate
            break
    restore_rng_state(own["rng"], parts.generator)  # last: nothing after this may draw random numbers
    return state, best_path
