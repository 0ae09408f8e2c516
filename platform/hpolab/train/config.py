"""TrainConfig: every knob of the shared training routine, as one frozen value.

This is a plain dataclass (train/ never imports pydantic). The study spec validates the YAML
`trainer:` section against this very class (pydantic understands stdlib dataclasses), so the
defaults and types live in one place. `__pydantic_config__` is a plain dict on purpose: it makes
pydantic reject unknown keys without train/ importing pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class TrainConfig:
    __pydantic_config__ = {"extra": "forbid"}

    max_epochs: int = 10
    batch_size: int = 64  # micro-batch, samples per forward pass
    grad_accum_steps: int = 1  # micro-batches per optimizer step; effective batch = batch_size * this
    eval_batch_size: int = 512  # validation/test batch, samples

    lr: float = 1e-3  # peak LR per optimizer step (at the effective batch)
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    momentum: float = 0.9  # sgd only
    nesterov: bool = False  # sgd only
    betas: tuple[float, float] = (0.9, 0.999)  # adam/adamw
    weight_decay: float = 0.01  # never applied to biases or normalization weights

    scheduler: Literal["none", "cosine", "onecycle", "step", "plateau"] = "cosine"
    warmup_epochs: float = 0.0  # linear warm-up from lr/100, per optimizer step (not with onecycle)
    min_lr: float = 0.0  # cosine floor
    step_size: int = 10  # step scheduler: epochs between decays
    gamma: float = 0.1  # step decay factor; plateau reduction factor
    plateau_patience: int = 2  # epochs without improvement of the study metric before reducing

    grad_clip_norm: float | None = None  # max global L2 norm; None = no clipping (norm still logged)
    amp: Literal["auto", "bf16", "fp16", "off"] = "auto"  # auto: bf16 on CUDA if supported, fp16 on older CUDA, off on CPU
    label_smoothing: float = 0.0

    # Class imbalance. Any of these on => per-class recall and macro-F1 are reported.
    # class_weighting also applies to multilabel: BCE pos_weight = negatives/positives per label.
    class_weighting: Literal["none", "inverse_freq"] = "none"
    balanced_sampler: bool = False  # WeightedRandomSampler over the train split
    focal_gamma: float = 0.0  # > 0 switches to focal loss

    # Task options (experiments/README.md "Your own task"); each applies to one task only.
    regression_loss: Literal["mse", "huber", "l1"] = "mse"  # regression: training loss (and val_loss)
    standardize_targets: bool = False  # regression: train on (y - mean) / std of the train split; metrics, serving and predict in your units
    multilabel_threshold: float = 0.5  # multilabel: probability at or above which a label is predicted (F1 metrics, predict)

    early_stopping_patience: int | None = None  # epochs without improvement; None = off
    early_stopping_min_delta: float = 0.0  # improvement smaller than this does not count

    deterministic: bool = False  # cudnn.deterministic + torch.use_deterministic_algorithms (slower)
    num_workers: int = 0  # DataLoader workers; 0 for in-memory data
    device: Literal["auto", "cpu", "cuda"] = "auto"
    compile: bool = False  # torch.compile the model
    channels_last: bool = False  # memory format for conv nets on CUDA
    # Multi-device trials (DistributedDataParallel, one process per device; gloo on the CPU, nccl on CUDA).
    # The effective batch does not change with devices: each process trains on batch_size / devices
    # samples per micro-batch, so a study's results keep their meaning whatever the devices.
    devices: int = 1  # processes (GPUs) per trial; 1 = a plain single process, torch.distributed untouched
    sync_batchnorm: bool = False  # devices > 1 on CUDA: BatchNorm statistics over the whole batch (SyncBatchNorm)

    # Fault injection for tests (documented, off by default): raise at this global micro-step.
    inject_oom_at_step: int | None = None  # raises torch.cuda.OutOfMemoryError
    inject_nan_at_step: int | None = None  # makes the loss NaN

    tags: dict[str, str] = field(default_factory=dict)  # free-form, carried into the run

    def __post_init__(self) -> None:
        # Early, named rejections (the study spec turns these into field errors).
        if self.max_epochs < 1:
            raise ValueError("max_epochs must be >= 1")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if self.grad_accum_steps < 1:
            raise ValueError("grad_accum_steps must be >= 1")
        if not self.lr > 0:
            raise ValueError("lr must be > 0")
        if self.weight_decay < 0:
            raise ValueError("weight_decay must be >= 0")
        if self.grad_clip_norm is not None and not self.grad_clip_norm > 0:
            raise ValueError("grad_clip_norm must be > 0, or null for no clipping")
        if self.devices < 1:
            raise ValueError("devices must be >= 1")
        if self.batch_size % self.devices:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be divisible by devices ({self.devices}): each of the "
                f"{self.devices} processes trains on batch_size / devices samples per micro-batch (the effective "
                f"batch stays batch_size * grad_accum_steps); use a multiple of {self.devices}"
            )
        if self.num_workers < 0:
            raise ValueError("num_workers must be >= 0")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError("label_smoothing must be in [0, 1)")
        if self.focal_gamma < 0:
            raise ValueError("focal_gamma must be >= 0")
        if not 0 < self.multilabel_threshold < 1:
            raise ValueError("multilabel_threshold must be in (0, 1)")
        if self.early_stopping_patience is not None and self.early_stopping_patience < 1:
            raise ValueError("early_stopping_patience must be >= 1, or null to turn it off")


def trainer_config(section: dict[str, Any]) -> TrainConfig:
    """A resolved config's `trainer:` section (plain data, e.g. from YAML/JSON) -> TrainConfig."""
    values = dict(section)
    if isinstance(values.get("betas"), list):
        values["betas"] = tuple(values["betas"])
    return TrainConfig(**values)
