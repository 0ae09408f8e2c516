"""The task an experiment declares, and checks of a spec's metric and a split's targets against it."""

from __future__ import annotations

from typing import Any

import torch

from ..config import TrainConfig
from .classification import Classification
from .common import TASKS
from .custom import Custom, strip_val_prefix
from .multilabel import Multilabel
from .regression import Regression


def task_for(experiment: Any) -> Any:
    """The task an experiment module declares: TASK (default "classification"); for TASK = "custom",
    its loss, metrics and METRIC_DIRECTIONS (and optional predict). ValueError names what is wrong."""
    name = getattr(experiment, "TASK", "classification")
    where = getattr(experiment, "__name__", "the experiment")
    if name == "classification":
        return Classification()
    if name == "regression":
        return Regression()
    if name == "multilabel":
        return Multilabel()
    if name != "custom":
        raise ValueError(f"{where}: TASK = {name!r} is not a task; use one of {', '.join(TASKS)}")
    missing = [a for a in ("loss", "metrics", "METRIC_DIRECTIONS") if not hasattr(experiment, a)]
    if missing:
        raise ValueError(f"{where}: TASK = 'custom' needs {', '.join(missing)} (see experiments/README.md)")
    directions = experiment.METRIC_DIRECTIONS
    bad = [f"{k}: {v!r}" for k, v in dict(directions).items() if v not in ("maximize", "minimize")]
    reserved = [k for k in directions if strip_val_prefix(k) == "loss" or not str(k).replace("_", "").isalnum()]
    if bad or reserved or not directions:
        raise ValueError(f"{where}: METRIC_DIRECTIONS must map metric names (letters, digits, _; not 'loss', which is "
                         f"always val_loss) to 'maximize' or 'minimize'; problems: {', '.join(bad + reserved) or 'it is empty'}")
    return Custom(experiment.loss, experiment.metrics, dict(directions), getattr(experiment, "predict", None))


def metric_problems(task: Any, cfg: TrainConfig, metric: str, direction: str) -> list[str]:
    """The spec's metric/direction against the task (spec validation and fit() use this)."""
    names = ["train_loss", *task.metric_directions(cfg)]
    want = "minimize" if metric == "train_loss" else task.direction_of(metric, cfg)
    if want is None:
        return [f"metric: {metric!r} is not a metric of task {task.name}; use one of {', '.join(names)}{task.metric_hint(metric)}"]
    if direction != want:
        return [f"direction: {metric} should be {want[:-1]}ed for task {task.name}; set direction: {want}"]
    return []


def sample_targets(ds, n: int = 256) -> torch.Tensor:
    """The first `n` targets of a split (all of them when it is in memory): what check_targets sees."""
    from ..data import is_in_memory

    if is_in_memory(ds):
        return ds.tensors[1]
    return torch.stack([torch.as_tensor(ds[i][1]) for i in range(min(n, len(ds)))])
