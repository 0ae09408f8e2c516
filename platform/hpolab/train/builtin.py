"""The platform's routine as a `train(config, trial)`, the contract an own training loop implements.

An experiment that defines data + model + task trains through the same trial object as an own loop:
each epoch is `trial.report(epoch, metrics)` (True: stop now), its checkpoints live in `trial.dir`,
and a trial that starts after epoch 1 (`trial.start_epoch`) resumes from the `last.pt` there. What
the routine can do that a user's loop may not is said by attributes of the function, not by branches
of its callers: `resumes_exactly` (fit() restores every RNG stream, so a resumed run is bit-for-bit
the uninterrupted one). `hpolab reproduce` runs every experiment this way; the trial process still
calls fit() itself (study/trials/trial_process.py).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Callable


def builtin_train(experiment: ModuleType) -> Callable[[dict[str, Any], Any], Any]:
    """`train(config, trial)` for `experiment`: its load_data/build_model and task on fit()."""

    def train(config: dict[str, Any], trial: Any):
        from .config import trainer_config
        from .data import data_seed_of
        from .loop import fit
        from .tasks import task_for

        data = experiment.load_data(config["data"], data_seed_of(config))
        model = experiment.build_model(config["model"], data.input_shape, data.num_classes)
        resume = Path(trial.dir) / "last.pt" if trial.start_epoch > 1 else None
        return fit(trainer_config(config["trainer"]), model, data, metric=config["metric"], direction=config["direction"],
                   seed=config["seed"], checkpoint_dir=trial.dir, task=task_for(experiment), resume_from=resume,
                   on_epoch=lambda epoch, metrics: trial.report(epoch, metrics))

    train.resumes_exactly = True  # type: ignore[attr-defined]
    return train
