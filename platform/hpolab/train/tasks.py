"""Tasks: what a model's outputs and the targets mean -- the loss, the validation metrics, what serving
returns, and which targets are valid. An experiment declares its task (`TASK = "regression"`; default
"classification"), or brings its own loss and metrics (`TASK = "custom"`).

A task is a small object with the same methods whatever the task (no inheritance):

    metric_directions(cfg)        {"val_rmse": "minimize", ...}: the val_* metrics a study may select on
    check_config(cfg)             problems with trainer options that do not apply to this task
    check_targets(targets, k)     one clear ValueError naming the task and what it expected
    bind(cfg, data, device)       a BoundTask: the same task with what it learns from the train split
                                  (class weights, target mean/std)

A BoundTask does the work:

    criterion(outputs, targets)   the training loss (a mean over the batch; what the optimizer minimizes)
    val_loss_sum(outputs, targets) summed validation loss of a batch (float64)
    keep(outputs)                 what evaluation keeps of a batch for the split's metrics
    split_metrics(kept, targets)  metrics over the whole split (outputs concatenated), no "val_" prefix
    head()                        an nn.Module turning model outputs into served predictions, or None
    evaluate_served(served, y)    {"loss", <metrics>, "n"} from served predictions (promote's test metrics)

Classification is exactly the routine's behaviour before tasks existed (bit for bit): the training
criterion is cross-entropy / label smoothing / focal / class weights; val_loss is plain cross-entropy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import TrainConfig
from .metrics import classification_metrics, classification_stats

TASKS = ("classification", "regression", "multilabel", "custom")
RUN_METRICS = ("train_loss",)  # besides the task's val_* metrics; minimized


def _imbalance_on(cfg: TrainConfig) -> bool:
    return cfg.class_weighting != "none" or cfg.balanced_sampler or cfg.focal_gamma > 0


def _defaults() -> TrainConfig:
    return TrainConfig()


def _changed(cfg: TrainConfig, names: tuple[str, ...]) -> list[str]:
    d = _defaults()
    return [n for n in names if getattr(cfg, n) != getattr(d, n)]


CLASSIFICATION_ONLY = ("label_smoothing", "focal_gamma", "balanced_sampler")
REGRESSION_ONLY = ("regression_loss", "standardize_targets")
MULTILABEL_ONLY = ("multilabel_threshold",)


def _foreign_options(task: str, cfg: TrainConfig, own: tuple[str, ...]) -> list[str]:
    """Trainer options set away from their default that belong to another task."""
    every = CLASSIFICATION_ONLY + REGRESSION_ONLY + MULTILABEL_ONLY + ("class_weighting",)
    foreign = [n for n in every if n not in own]
    return [f"trainer.{n}: applies to {_owner(n)}, not to task {task}; remove it" for n in _changed(cfg, tuple(foreign))]


def _owner(name: str) -> str:
    if name in REGRESSION_ONLY:
        return "task regression"
    if name in MULTILABEL_ONLY:
        return "task multilabel"
    if name == "class_weighting":
        return "tasks classification and multilabel"
    return "task classification"


def _as_2d(targets: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    return targets.reshape(outputs.shape) if targets.dim() == 1 and outputs.dim() == 2 and outputs.shape[1] == 1 else targets


# ================================================================ classification


class Classification:
    name = "classification"
    target_dtype = torch.long  # what batches convert targets to
    numpy_target_dtype = "int64"

    def metric_directions(self, cfg: TrainConfig, num_outputs: int | None = None) -> dict[str, str]:
        out = {"val_loss": "minimize", "val_acc": "maximize"}
        if _imbalance_on(cfg):
            out["val_macro_f1"] = "maximize"
            out.update({f"val_recall_{c}": "maximize" for c in range(num_outputs or 0)})
        return out

    def direction_of(self, metric: str, cfg: TrainConfig) -> str | None:
        if metric.startswith("val_recall_") and metric[len("val_recall_"):].isdigit() and _imbalance_on(cfg):
            return "maximize"
        return self.metric_directions(cfg).get(metric)

    def metric_hint(self, metric: str) -> str:
        if metric == "val_macro_f1" or metric.startswith("val_recall_"):
            return (" (val_macro_f1 and val_recall_<class> exist when an imbalance option is on: "
                    "class_weighting, balanced_sampler or focal_gamma)")
        return ""

    def check_config(self, cfg: TrainConfig) -> list[str]:
        return _foreign_options(self.name, cfg, CLASSIFICATION_ONLY + ("class_weighting",))

    def check_targets(self, targets: torch.Tensor, num_outputs: int) -> None:
        t = torch.as_tensor(targets)
        if t.is_floating_point() and not bool((t == t.round()).all()):
            raise ValueError(f"task classification expects integer class labels 0..{num_outputs - 1} of shape (N,); "
                             f"got non-integer {t.dtype} targets (a regression experiment? set TASK = \"regression\")")
        if t.dim() != 1:
            raise ValueError(f"task classification expects class labels of shape (N,), got {tuple(t.shape)} "
                             "(one-hot or multi-label targets? use TASK = \"multilabel\")")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_outputs):
            raise ValueError(f"task classification expects labels in 0..{num_outputs - 1} (num_classes={num_outputs}), "
                             f"got {int(t.min())}..{int(t.max())}")

    def bind(self, cfg: TrainConfig, data, device: torch.device) -> "BoundClassification":
        from .losses import criterion_from_config

        return BoundClassification(self, criterion_from_config(cfg, data, device), data.num_classes, _imbalance_on(cfg))

    def unbound(self, num_outputs: int) -> "BoundClassification":
        """For served predictions only (promote, the champion): no training criterion."""
        return BoundClassification(self, None, num_outputs, False)


@dataclass
class BoundClassification:
    task: Classification
    criterion: Any  # nn.Module (cross-entropy / focal, with the trainer's options)
    num_outputs: int
    imbalance: bool

    def val_loss_sum(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets, reduction="sum")  # plain CE: comparable across trials

    def keep(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.argmax(dim=1)  # predicted classes are all the metrics need

    def split_metrics(self, kept: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        return classification_stats(targets, kept, self.num_outputs)

    def epoch_metrics(self, val: dict[str, Any]) -> dict[str, float]:
        out = {"val_acc": val["acc"]}
        if self.imbalance:
            out["val_macro_f1"] = val["macro_f1"]
            out.update({f"val_recall_{c}": r for c, r in enumerate(val["recall"])})
        return out

    def head(self) -> nn.Module | None:
        return None  # serving returns logits, as always; predict turns them into classes + probabilities

    def evaluate_served(self, served: torch.Tensor, y) -> dict[str, float]:
        return classification_metrics(served, y, self.num_outputs)


# ================================================================ regression


class Standardized(nn.Module):
    """Model outputs in standard units -> the user's units: outputs * std + mean (per output)."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.register_buffer("mean", mean.float().reshape(1, -1))
        self.register_buffer("std", std.float().reshape(1, -1))

    def forward(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.float() * self.std + self.mean


REGRESSION_LOSSES: dict[str, Callable[..., torch.Tensor]] = {"mse": F.mse_loss, "huber": F.huber_loss, "l1": F.l1_loss}


class Regression:
    name = "regression"
    target_dtype = torch.float32
    numpy_target_dtype = "float32"

    def metric_directions(self, cfg: TrainConfig, num_outputs: int | None = None) -> dict[str, str]:
        return {"val_loss": "minimize", "val_rmse": "minimize", "val_mae": "minimize", "val_r2": "maximize"}

    def direction_of(self, metric: str, cfg: TrainConfig) -> str | None:
        return self.metric_directions(cfg).get(metric)

    def metric_hint(self, metric: str) -> str:
        return " (regression reports errors in your units: val_rmse, val_mae; val_r2; val_loss is the trainer's regression_loss)" if metric == "val_acc" else ""

    def check_config(self, cfg: TrainConfig) -> list[str]:
        return _foreign_options(self.name, cfg, REGRESSION_ONLY)

    def check_targets(self, targets: torch.Tensor, num_outputs: int) -> None:
        t = torch.as_tensor(targets)
        if not t.is_floating_point():
            raise ValueError(f"task regression expects float targets of shape (N,) or (N, {num_outputs}), got {t.dtype} "
                             "(integer class labels? leave TASK unset for classification; else convert targets to float32)")
        ok = (t.dim() == 1 and num_outputs == 1) or (t.dim() == 2 and t.shape[1] == num_outputs)
        if not ok:
            raise ValueError(f"task regression expects targets of shape (N,) with one model output or (N, k) with k = "
                             f"num_classes outputs (here {num_outputs}); got {tuple(t.shape)}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError("task regression expects finite targets; some are NaN or inf")

    def bind(self, cfg: TrainConfig, data, device: torch.device) -> "BoundRegression":
        from .data import targets_of

        k = data.num_classes
        if cfg.standardize_targets:
            y = targets_of(data.train).double().reshape(len(data.train), -1)
            mean, std = y.mean(0), y.std(0, unbiased=False)
            std = torch.where(std > 0, std, torch.ones_like(std))  # a constant target: keep its units
        else:
            mean, std = torch.zeros(k, dtype=torch.float64), torch.ones(k, dtype=torch.float64)
        return BoundRegression(self, cfg.regression_loss, Standardized(mean, std).to(device))

    def unbound(self, num_outputs: int, loss: str = "mse") -> "BoundRegression":
        return BoundRegression(self, loss, Standardized(torch.zeros(num_outputs), torch.ones(num_outputs)))


@dataclass
class BoundRegression:
    task: Regression
    loss_name: str
    scale: Standardized  # the inverse of the target standardisation (identity when it is off)

    def _standard(self, targets: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        t = _as_2d(targets, outputs)
        if t.shape != outputs.shape:
            raise ValueError(f"task regression: model outputs {tuple(outputs.shape)} do not match targets {tuple(targets.shape)}; "
                             "build_model must return (N, num_classes) with num_classes = the number of targets")
        return (t.float() - self.scale.mean) / self.scale.std

    def criterion(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        outputs = outputs.float()
        return REGRESSION_LOSSES[self.loss_name](outputs, self._standard(targets, outputs))

    def val_loss_sum(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # mean over the outputs of each sample, summed over samples: / N gives the criterion's mean
        per = REGRESSION_LOSSES[self.loss_name](outputs, self._standard(targets, outputs), reduction="none")
        return per.double().mean(dim=1).sum()

    def keep(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs

    def split_metrics(self, kept: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        return regression_stats(self.scale.cpu()(kept), targets)

    def epoch_metrics(self, val: dict[str, Any]) -> dict[str, float]:
        return {"val_rmse": val["rmse"], "val_mae": val["mae"], "val_r2": val["r2"]}

    def head(self) -> nn.Module | None:
        return self.scale.cpu()

    def evaluate_served(self, served: torch.Tensor, y) -> dict[str, float]:
        y = torch.as_tensor(y)
        scale = self.scale.cpu()
        pred = served.float()
        loss = self.val_loss_sum((pred - scale.mean) / scale.std, y) / len(y)
        return {"loss": float(loss), **regression_stats(pred, y), "n": int(len(y))}


def regression_stats(pred: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """rmse and mae over every target value; r2 per output, averaged (scikit-learn's uniform_average)."""
    y = _as_2d(torch.as_tensor(targets), pred).double()
    p = pred.double().reshape(y.shape)
    err = p - y
    ss_tot = ((y - y.mean(0)) ** 2).sum(0)
    r2 = 1 - (err**2).sum(0) / torch.where(ss_tot > 0, ss_tot, torch.full_like(ss_tot, math.nan))
    return {"rmse": float(err.pow(2).mean().sqrt()), "mae": float(err.abs().mean()), "r2": float(r2.mean())}


# ================================================================ multilabel


class Multilabel:
    name = "multilabel"
    target_dtype = torch.float32
    numpy_target_dtype = "float32"

    def metric_directions(self, cfg: TrainConfig, num_outputs: int | None = None) -> dict[str, str]:
        return {"val_loss": "minimize", "val_micro_f1": "maximize", "val_macro_f1": "maximize", "val_map": "maximize"}

    def direction_of(self, metric: str, cfg: TrainConfig) -> str | None:
        return self.metric_directions(cfg).get(metric)

    def metric_hint(self, metric: str) -> str:
        return ""

    def check_config(self, cfg: TrainConfig) -> list[str]:
        return _foreign_options(self.name, cfg, MULTILABEL_ONLY + ("class_weighting",))

    def check_targets(self, targets: torch.Tensor, num_outputs: int) -> None:
        t = torch.as_tensor(targets)
        if t.dim() != 2 or t.shape[1] != num_outputs:
            raise ValueError(f"task multilabel expects targets of shape (N, {num_outputs}) (one 0/1 column per label, "
                             f"num_classes = {num_outputs} labels); got {tuple(t.shape)}")
        if not bool(((t == 0) | (t == 1)).all()):
            raise ValueError("task multilabel expects targets in {0, 1}; got other values")

    def bind(self, cfg: TrainConfig, data, device: torch.device) -> "BoundMultilabel":
        from .data import targets_of

        pos_weight = None
        if cfg.class_weighting == "inverse_freq":  # BCE pos_weight = negatives / positives, per label
            y = targets_of(data.train).double()
            pos = y.sum(0)
            pos_weight = ((len(y) - pos) / pos.clamp(min=1)).float().to(device)
        return BoundMultilabel(self, pos_weight, cfg.multilabel_threshold)

    def unbound(self, num_outputs: int, threshold: float = 0.5) -> "BoundMultilabel":
        return BoundMultilabel(self, None, threshold)


@dataclass
class BoundMultilabel:
    task: Multilabel
    pos_weight: torch.Tensor | None
    threshold: float  # probability at or above which a label is predicted

    def criterion(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs.float(), targets.float(), pos_weight=self.pos_weight)

    def val_loss_sum(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # plain BCE (no pos_weight): comparable across trials; mean over labels, summed over samples
        per = F.binary_cross_entropy_with_logits(outputs.float(), targets.float(), reduction="none")
        return per.double().mean(dim=1).sum()

    def keep(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs

    def split_metrics(self, kept: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        return multilabel_stats(torch.sigmoid(kept.float()), targets, self.threshold)

    def epoch_metrics(self, val: dict[str, Any]) -> dict[str, float]:
        return {"val_micro_f1": val["micro_f1"], "val_macro_f1": val["macro_f1"], "val_map": val["map"]}

    def head(self) -> nn.Module | None:
        return nn.Sigmoid()  # per-label probabilities

    def evaluate_served(self, served: torch.Tensor, y) -> dict[str, float]:
        y = torch.as_tensor(y).double()
        p = served.double().clamp(1e-7, 1 - 1e-7)
        loss = float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())
        return {"loss": loss, **multilabel_stats(served, y, self.threshold), "n": int(len(y))}


def multilabel_stats(probs: torch.Tensor, targets: torch.Tensor, threshold: float) -> dict[str, float]:
    """micro-F1 and macro-F1 at `threshold` (macro over labels seen in targets or predictions), and mean
    average precision over the labels with at least one positive."""
    y = torch.as_tensor(targets).double()
    p = probs.double()
    pred = (p >= threshold).double()
    tp, fp, fn = (pred * y).sum(0), (pred * (1 - y)).sum(0), ((1 - pred) * y).sum(0)
    denom = 2 * tp + fp + fn
    micro = float(2 * tp.sum() / denom.sum()) if denom.sum() > 0 else math.nan
    seen = denom > 0
    macro = float((2 * tp[seen] / denom[seen]).mean()) if seen.any() else math.nan
    aps = []
    for j in range(y.shape[1]):
        n_pos = y[:, j].sum()
        if n_pos == 0:
            continue
        order = torch.argsort(p[:, j], descending=True, stable=True)
        hits = y[order, j]
        precision_at_k = hits.cumsum(0) / torch.arange(1, len(hits) + 1, dtype=torch.float64)
        aps.append(float((precision_at_k * hits).sum() / n_pos))
    return {"micro_f1": micro, "macro_f1": macro, "map": sum(aps) / len(aps) if aps else math.nan}


# ================================================================ custom


class Custom:
    """The experiment's own `loss(outputs, targets)` and `metrics(outputs, targets) -> dict[str, float]`,
    with `METRIC_DIRECTIONS = {"val_iou": "maximize", ...}` (names with or without the val_ prefix)."""

    name = "custom"
    target_dtype = None  # targets reach the loss as the experiment made them
    numpy_target_dtype = None

    def __init__(self, loss: Callable, metrics: Callable, directions: dict[str, str], predict: Callable | None = None):
        self.loss, self.metrics, self.predict = loss, metrics, predict
        self.directions = {_strip(k): v for k, v in directions.items()}

    def metric_directions(self, cfg: TrainConfig, num_outputs: int | None = None) -> dict[str, str]:
        return {"val_loss": "minimize", **{f"val_{k}": v for k, v in self.directions.items()}}

    def direction_of(self, metric: str, cfg: TrainConfig) -> str | None:
        return self.metric_directions(cfg).get(metric)

    def metric_hint(self, metric: str) -> str:
        return " (a custom task's metrics are the names in the experiment's METRIC_DIRECTIONS)"

    def check_config(self, cfg: TrainConfig) -> list[str]:
        return _foreign_options(self.name, cfg, ())

    def check_targets(self, targets: torch.Tensor, num_outputs: int) -> None:
        return None  # the experiment's loss knows its targets

    def bind(self, cfg: TrainConfig, data, device: torch.device) -> "BoundCustom":
        return BoundCustom(self)

    def unbound(self, num_outputs: int) -> "BoundCustom":
        return BoundCustom(self)


def _strip(name: str) -> str:
    return name[len("val_"):] if name.startswith("val_") else name


class _Predict(nn.Module):
    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, outputs: torch.Tensor) -> torch.Tensor:
        return self.fn(outputs)


@dataclass
class BoundCustom:
    task: Custom

    def criterion(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.task.loss(outputs, targets)

    def val_loss_sum(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.task.loss(outputs, targets).double() * len(outputs)

    def keep(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs

    def split_metrics(self, kept: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        got = {_strip(k): float(v) for k, v in self.task.metrics(kept, targets).items()}
        missing = set(self.task.directions) - set(got)
        if missing:
            raise ValueError(f"task custom: the experiment's metrics() did not return {', '.join(sorted(missing))} "
                             "(declared in METRIC_DIRECTIONS)")
        return got

    def epoch_metrics(self, val: dict[str, Any]) -> dict[str, float]:
        return {f"val_{k}": val[k] for k in self.task.directions}

    def head(self) -> nn.Module | None:
        return _Predict(self.task.predict) if self.task.predict is not None else None

    def evaluate_served(self, served: torch.Tensor, y) -> dict[str, float]:
        # served = the experiment's predict(outputs) when it has one: its metrics must accept those
        y = torch.as_tensor(y)
        return {"loss": float(self.task.loss(served, y)), **self.split_metrics(served, y), "n": int(len(y))}


# ================================================================ from an experiment


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
    reserved = [k for k in directions if _strip(k) == "loss" or not str(k).replace("_", "").isalnum()]
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
    from .data import is_in_memory

    if is_in_memory(ds):
        return ds.tensors[1]
    return torch.stack([torch.as_tensor(ds[i][1]) for i in range(min(n, len(ds)))])
