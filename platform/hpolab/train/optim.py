"""Optimizer (with weight-decay parameter groups), the parameter-registration checks, and the LR schedule.

LR schedule granularity (one `LRSchedule` owns it, the loop only says "an optimizer step happened"
and "an epoch ended"):

- onecycle: torch's OneCycleLR, stepped per optimizer step, max_lr = cfg.lr, 30% warm-up (its own;
  cfg.warmup_epochs is ignored). LR only: cycle_momentum=False, so the configured momentum/betas
  are the ones used.
- cosine: per optimizer step (smooth, and it composes with a per-step warm-up), from cfg.lr down
  to cfg.min_lr at the last optimizer step of max_epochs.
- step: multiply by cfg.gamma every cfg.step_size epochs. Evaluated per optimizer step from the
  number of completed epochs, which is the same thing as StepLR stepped at each epoch end, and lets
  the warm-up ramp share one scheduler.
- plateau: ReduceLROnPlateau on the study metric (mode from the direction), stepped at epoch end;
  it starts acting after the warm-up has finished.
- none: constant cfg.lr (after the optional warm-up).
Warm-up (all but onecycle): linear per optimizer step from cfg.lr/100 to cfg.lr over
cfg.warmup_epochs epochs.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
from torch import nn

WARMUP_START_FACTOR = 0.01  # warm-up starts at lr/100
ONECYCLE_PCT_START = 0.3  # fraction of the run spent rising to max_lr (torch's default)


# ---------------------------------------------------------------- parameter registration checks


def find_unregistered_parameters(model: nn.Module) -> list[str]:
    """Trainable tensors / modules a model holds but does not register (so `.parameters()` misses them).

    Catches the classic bug: layers kept in a python list/dict/tuple instead of nn.ModuleList /
    nn.ModuleDict, or a requires_grad tensor kept as a plain attribute instead of an nn.Parameter.
    Such weights are never optimized, never moved to the device and never saved. A list holding
    references to modules that *are* registered elsewhere (shared layers) is fine.
    """
    registered = {id(p) for p in model.parameters()}
    problems: list[str] = []

    def unregistered_in(obj: Any) -> bool:
        if isinstance(obj, nn.Module):  # frozen modules (e.g. a teacher kept out of .parameters()) are fine
            return any(p.requires_grad and id(p) not in registered for p in obj.parameters())
        if isinstance(obj, torch.Tensor):  # leaf only: a cached activation (has a grad_fn) is not a weight
            return obj.requires_grad and obj.is_leaf and id(obj) not in registered
        return False

    for mod_name, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr.startswith("_"):  # nn.Module internals (_parameters, _modules, _buffers, hooks ...)
                continue
            if isinstance(value, (list, tuple, set, frozenset)):
                items = list(value)
            elif isinstance(value, dict):
                items = list(value.values())
            else:
                items = [value]
            if any(unregistered_in(item) for item in items):
                where = f"{mod_name}.{attr}" if mod_name else attr
                problems.append(where)
    return problems


def check_trainable_parameters(model: nn.Module) -> None:
    """Raise when the model has no trainable parameter or holds unregistered ones."""
    unregistered = find_unregistered_parameters(model)
    if unregistered:
        raise ValueError(
            f"the model holds trainable weights that are not registered as parameters: {', '.join(unregistered)}. "
            "They would never be optimized, moved to the device or saved. Keep layers in nn.ModuleList / "
            "nn.ModuleDict / nn.Sequential (not a python list or dict) and tensors in nn.Parameter."
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            "the model has no trainable parameters (none registered, or all have requires_grad=False): "
            "nothing to optimize. Register layers with nn.ModuleList / nn.Sequential and weights with nn.Parameter."
        )


def check_optimizer_covers(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every trainable parameter of the model must be in one of the optimizer's groups."""
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in in_optimizer]
    if missing:
        raise ValueError(f"the optimizer does not see these trainable parameters: {', '.join(missing)}")


# ---------------------------------------------------------------- optimizer


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: weights of matrices/kernels decay; biases and normalization weights (ndim <= 1) do not.

    Decaying a bias or a norm gain only pulls it toward 0 (a scale the next layer then has to
    undo); it regularizes nothing. Frozen parameters (requires_grad=False) are left out.
    """
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(
    name: str,
    params: Iterable[dict[str, Any]],
    *,
    lr: float,
    momentum: float = 0.9,
    nesterov: bool = False,
    betas: tuple[float, float] = (0.9, 0.999),
) -> torch.optim.Optimizer:
    """AdamW (decoupled decay), Adam (L2 decay, as torch implements it) or SGD (+momentum, nesterov)."""
    params = list(params)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=tuple(betas))
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=tuple(betas))
    if name == "sgd":
        if nesterov and momentum <= 0:
            raise ValueError("sgd with nesterov=true needs momentum > 0; set momentum (e.g. 0.9) or nesterov=false")
        return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov)
    raise ValueError(f"optimizer must be 'adamw', 'adam' or 'sgd', got {name!r}")


# ---------------------------------------------------------------- LR schedule


def _warmup_factor(step: int, warmup_steps: int) -> float:
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    return WARMUP_START_FACTOR + (1.0 - WARMUP_START_FACTOR) * step / warmup_steps


class LRSchedule:
    """The learning-rate schedule of one run; the loop calls `after_optimizer_step` and `after_epoch`.

    `steps_per_epoch` counts optimizer steps (not micro-batches). State is plain data for the
    checkpoint.
    """

    def __init__(
        self,
        kind: str,
        optimizer: torch.optim.Optimizer,
        *,
        lr: float,
        steps_per_epoch: int,
        max_epochs: int,
        warmup_epochs: float = 0.0,
        min_lr: float = 0.0,
        step_size: int = 10,
        gamma: float = 0.1,
        plateau_patience: int = 2,
        direction: str = "maximize",
    ):
        if steps_per_epoch < 1:
            raise ValueError("steps_per_epoch must be >= 1")
        self.kind = kind
        self.total_steps = steps_per_epoch * max_epochs  # optimizer steps in the whole run
        self.warmup_steps = 0 if kind == "onecycle" else round(warmup_epochs * steps_per_epoch)
        self.per_step: torch.optim.lr_scheduler.LRScheduler | None = None
        self.plateau: torch.optim.lr_scheduler.ReduceLROnPlateau | None = None
        self.steps_done = 0  # optimizer steps seen

        if kind == "onecycle":
            self.per_step = torch.optim.lr_scheduler.OneCycleLR(
                optimizer, max_lr=lr, total_steps=self.total_steps, pct_start=ONECYCLE_PCT_START, cycle_momentum=False
            )
            return
        if kind not in ("none", "cosine", "step", "plateau"):
            raise ValueError(f"scheduler must be 'none', 'cosine', 'onecycle', 'step' or 'plateau', got {kind!r}")
        if kind == "cosine" and min_lr > lr:
            raise ValueError(f"min_lr ({min_lr}) must not exceed lr ({lr})")

        warmup, total = self.warmup_steps, self.total_steps
        floor = min_lr / lr

        # Multiplicative LR factor for optimizer step `s` (0-based); the LR used by step s is lr * f(s).
        def factor(s: int) -> float:
            f = _warmup_factor(s, warmup)
            if kind == "cosine":
                progress = min(max(s - warmup, 0) / max(total - warmup, 1), 1.0)
                f *= floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
            elif kind == "step":
                f *= gamma ** ((s // steps_per_epoch) // step_size)
            return f

        if kind in ("cosine", "step") or warmup > 0:
            self.per_step = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        if kind == "plateau":
            mode = "max" if direction == "maximize" else "min"
            self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, mode=mode, factor=gamma, patience=plateau_patience
            )

    def after_optimizer_step(self) -> None:
        self.steps_done += 1
        if self.per_step is None:
            return
        if self.kind == "plateau" and self.steps_done > self.warmup_steps:
            return  # warm-up over: plateau owns the LR from here on (LambdaLR would overwrite its cuts)
        if self.kind == "onecycle" and self.steps_done >= self.per_step.total_steps:
            return  # OneCycleLR raises when stepped past its last step (its total survives a resume)
        self.per_step.step()

    def after_epoch(self, metric_value: float) -> None:
        if self.plateau is not None and self.steps_done >= self.warmup_steps and math.isfinite(metric_value):
            self.plateau.step(metric_value)

    def take_new_lr(self, lr: float, saved_lr: float, optimizer: torch.optim.Optimizer) -> None:
        """After a restore: continue this schedule from peak LR `lr` instead of the checkpoint's `saved_lr`.

        The schedule's position (steps done, plateau cuts) is kept: the LR of the next step is what
        the schedule gives at this step for the new peak, e.g. a cosine goes on along the curve of `lr`.
        """
        if lr == saved_lr:
            return
        ratio = lr / saved_lr
        lambda_owns = isinstance(self.per_step, torch.optim.lr_scheduler.LambdaLR) and not (
            self.kind == "plateau" and self.steps_done > self.warmup_steps
        )
        for i, group in enumerate(optimizer.param_groups):
            group["lr"] *= ratio  # none, plateau (its cuts kept), onecycle (linear in its peak)
            if self.kind == "onecycle":
                group["max_lr"], group["initial_lr"], group["min_lr"] = lr, group["initial_lr"] * ratio, group["min_lr"] * ratio
            elif "initial_lr" in group:
                group["initial_lr"] = lr
            if lambda_owns:  # exact: the new config's lambda (its floor, decay) at this step
                group["lr"] = lr * self.per_step.lr_lambdas[i](self.per_step.last_epoch)
            elif self.per_step is None and self.plateau is None:  # constant: exactly lr, whichever LR it came from
                group["lr"] = lr
        for scheduler in (self.per_step, self.plateau):
            if scheduler is not None:
                scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
        if self.per_step is not None:
            self.per_step.base_lrs = [group.get("initial_lr", lr) for group in optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "steps_done": self.steps_done,
            "per_step": self.per_step.state_dict() if self.per_step is not None else None,
            "plateau": self.plateau.state_dict() if self.plateau is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(f"checkpoint scheduler is {state.get('kind')!r}, this run uses {self.kind!r}")
        self.steps_done = int(state["steps_done"])
        if self.per_step is not None and state.get("per_step") is not None:
            self.per_step.load_state_dict(state["per_step"])
        if self.plateau is not None and state.get("plateau") is not None:
            self.plateau.load_state_dict(state["plateau"])


def take_group_settings(optimizer: torch.optim.Optimizer, cfg) -> None:
    """After a restore: the param groups take the config's weight decay, momentum and betas (the
    optimizer's state, its moments, is kept). The no-decay group keeps no decay."""
    for group in optimizer.param_groups:
        if group.get("name") == "decay":
            group["weight_decay"] = cfg.weight_decay
        if "momentum" in group:
            group["momentum"], group["nesterov"] = cfg.momentum, cfg.nesterov
        if "betas" in group:
            group["betas"] = tuple(cfg.betas)


def optimizer_from_config(cfg, model: nn.Module, lr: float | None = None) -> torch.optim.Optimizer:
    """The trainer's optimizer for `model` (weight-decay groups included); `lr` overrides cfg.lr."""
    return build_optimizer(
        cfg.optimizer,
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr if lr is None else lr,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        betas=cfg.betas,
    )


def schedule_from_config(cfg, optimizer: torch.optim.Optimizer, *, steps_per_epoch: int, direction: str) -> LRSchedule:
    """The trainer's LR schedule; `steps_per_epoch` counts optimizer steps, `direction` is the study metric's."""
    return LRSchedule(
        cfg.scheduler, optimizer, lr=cfg.lr, steps_per_epoch=steps_per_epoch, max_epochs=cfg.max_epochs,
        warmup_epochs=cfg.warmup_epochs, min_lr=cfg.min_lr, step_size=cfg.step_size, gamma=cfg.gamma,
        plateau_patience=cfg.plateau_patience, direction=direction,
    )
