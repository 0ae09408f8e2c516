"""A stand-in for the trial object `train(config, trial)` gets, recording what an adapter calls.

The integrations' callbacks see only this interface (report / checkpoint / restore / log_model / dir /
start_epoch); the real object is exercised end to end by the studies in the same test modules. Saved
states go through hpolab's own checkpoint serialization and come back as the platform reads them
(torch.load with weights_only=True): a state that only loads with pickled code fails here as it would
on a retry.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from hpolab.train.checkpoint import serialize_checkpoint


class RecordingTrial:
    def __init__(self, folder: Path, *, stop_at: int | None = None, restored: bytes | None = None, start_epoch: int = 1,
                 changes: tuple[dict, dict] | None = None):
        self.number = 0
        self.params: dict[str, Any] = {}
        self.config: dict[str, Any] = {}
        self.device = torch.device("cpu")
        self.dir = Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stop_at = stop_at  # report returns True from this epoch on
        self.restored = restored  # an earlier attempt's last checkpoint (bytes), or None
        self.start_epoch = start_epoch
        self.reports: list[tuple[int, dict[str, float]]] = []
        self.saved: list[tuple[int, bytes]] = []  # (epoch it belongs to, the serialized state)
        self.models: list[tuple[torch.nn.Module, torch.Tensor]] = []
        # (the checkpoint's config, this attempt's): what a resumed attempt's config changed, applied by the
        # platform's own code (study/trials/config_changes.py) as the real trial object applies it
        from hpolab.study.trials.config_changes import ConfigChanges

        self._changes = ConfigChanges(changes[1], changes[0]) if changes is not None else ConfigChanges({}, None)
        self.config_changes: dict[str, Any] = self._changes.read()
        self.applied: list[tuple[Any, Any]] = []  # (optimizer, schedulers) given to apply_config_changes
        self.weights_epoch: int | None = None

    @staticmethod
    def load(data: bytes) -> dict:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)

    def report(self, epoch: int, metrics: dict[str, float], checkpoint: dict | None = None) -> bool:
        assert isinstance(epoch, int) and all(isinstance(v, float) for v in metrics.values()), (epoch, metrics)
        assert not self.reports or epoch > self.reports[-1][0], f"epoch {epoch} reported after {self.reports[-1][0]}: epochs go up"
        self.reports.append((epoch, dict(metrics)))
        if checkpoint is not None:
            self.checkpoint(checkpoint)
        return self.stop_at is not None and epoch >= self.stop_at

    def checkpoint(self, state: dict) -> None:
        epoch = self.reports[-1][0] if self.reports else 0
        self.saved.append((epoch, serialize_checkpoint(state)))

    def restore(self) -> dict | None:
        return None if self.restored is None else self.load(self.restored)

    def log_model(self, model: torch.nn.Module, input_example: torch.Tensor, *, epoch: int | None = None) -> None:
        self.models.append((model, input_example))

    def apply_config_changes(self, optimizer, schedulers=()) -> list[str]:
        self.applied.append((optimizer, schedulers))
        return self._changes.apply(optimizer, schedulers)

    @property
    def epochs(self) -> list[int]:
        return [e for e, _ in self.reports]
