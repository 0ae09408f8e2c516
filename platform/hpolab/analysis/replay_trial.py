"""The trial object of `hpolab reproduce`: what an experiment's `train(config, trial)` talks to when a
run is trained again, the built-in routine's (train/builtin.py) and an own loop's alike.

It records the reports instead of sending them (every reported number, per epoch) and stops the loop
after the epoch its stretch ends at (report returns True then, as for a pruned trial, so a pruned trial
is compared on its epochs). Checkpoints stay in the reproduction's temporary folder (the routine's
last.pt) and in memory (an own loop's trial.checkpoint state); a PBT member's replay (reproduce_pbt.py)
trains stretch after stretch with the same trial: the next one starts at `start_epoch` from the last
checkpoint (`restore()`; the routine's last.pt), its config's new values in `config_changes` for the
loop to give its optimizer (`apply_config_changes`), as a resumed attempt's trial has them.
log_model and log_params are ignored: nothing is written to the stores.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

# Reported per epoch by loops that time themselves; they measure the machine, never reproduce.
TIMING = ("epoch_seconds", "samples_per_second", "data_wait_fraction")


class LocalTrial:
    """The trial of a reproduction (see the module docstring)."""

    def __init__(self, number: int, params: dict[str, Any], config: dict, folder: Path):
        import torch

        from hpolab.study.trials.config_changes import ConfigChanges
        from hpolab.study.trials.trial_contract import EpochNumbers

        self.number, self.params, self.config, self.dir = number, params, config, folder
        self.device, self.start_epoch = torch.device("cpu"), 1
        self.history: list[dict[str, float]] = []  # one dict per report: epoch (as recorded) + the numeric metrics
        self.weights_epoch: int | None = None
        self._epochs = EpochNumbers()  # the trial's own numbering: a loop counting from 0 is recorded from 1
        self._stop_after = 0
        self._saved: tuple[dict, dict] | None = None  # (state, config) of the last trial.checkpoint
        self._restored: dict | None = None
        self._changes = ConfigChanges(config, None)

    def stretch(self, config: dict, last: int) -> None:
        """Train on with `config` up to epoch `last`: from the last checkpoint when epochs were trained already."""
        from hpolab.study.trials.config_changes import ConfigChanges

        self.config = config
        self._stop_after = last
        done = int(self.history[-1]["epoch"]) if self.history else 0
        self.start_epoch = self._epochs.loop_epoch(done + 1) if done else 1
        state, saved_config = self._saved if done and self._saved is not None else (None, None)
        self._restored = copy.deepcopy(state)
        self._changes = ConfigChanges(config, saved_config)

    def report(self, epoch: Any, metrics: dict[str, float] | None = None, checkpoint: dict | None = None) -> bool:
        if metrics is None and isinstance(epoch, dict):  # trial.report(metrics): the next epoch
            epoch, metrics = None, epoch
        recorded = self._epochs.record(epoch, self.history[-1]["epoch"] if self.history else 0, 1)
        row: dict[str, float] = {"epoch": recorded}
        for k, v in metrics.items():
            try:
                row[str(k)] = float(v)
            except (TypeError, ValueError):
                continue  # not a number: the trial process would have refused it; nothing to compare
        self.history.append(row)
        if isinstance(checkpoint, dict):  # (a path: the loop wrote its own file, in self.dir)
            self.checkpoint(checkpoint)
        return recorded >= self._stop_after  # stop where the original stopped (or its stretch ends)

    @property
    def is_best(self) -> bool:
        return False  # (log_model is ignored: nothing to keep)

    def checkpoint(self, state: dict) -> None:
        self._saved = (copy.deepcopy(state), copy.deepcopy(self.config))  # (the loop changes its tensors next)

    def restore(self) -> dict | None:
        return self._restored

    @property
    def resume_path(self) -> Path | None:
        """A loop that writes its own checkpoints (the routine) resumes from its last.pt in self.dir."""
        return Path(self.dir) / "last.pt" if self.start_epoch > 1 else None

    def stop_requested(self, wait: bool = False) -> bool:
        return False  # (report's answer stops the loop where the original stopped)

    def describe(self, **fields: Any) -> None:
        pass

    @property
    def config_changes(self) -> dict[str, Any]:
        return self._changes.read()

    def apply_config_changes(self, optimizer, schedulers=()) -> list[str]:
        return self._changes.apply(optimizer, schedulers)

    def log_params(self, params: dict) -> None:
        pass

    def log_model(self, model, input_example, *, epoch: int | None = None) -> None:
        pass


def sampled_params(run, stores) -> dict[str, Any]:
    """trial.params as the trial had them: its Optuna trial's params ({} when the study is not reachable)."""
    from hpolab.stores.optuna_storage import load_study

    tags = run.data.tags
    try:
        study = load_study(tags["optuna.study"], stores)
        return dict(study.trials[int(tags["optuna.trial_number"])].params)
    except Exception:  # noqa: BLE001 -- a reproduction without the Optuna store: config still has every value
        return {}
