"""NaN/inf losses: the error that stops a trial, and the watch that finds the first bad training step."""

from __future__ import annotations

import math

import torch

# On CUDA, checking the loss for NaN/inf after every micro-step would force a host-device sync each
# step. The losses are queued and checked together every this many micro-steps (and at epoch end);
# the error still names the first bad step. On the CPU there is no sync to avoid: every step, and
# before the backward pass.
CUDA_NONFINITE_CHECK_EVERY = 16


class NonFiniteLossError(RuntimeError):
    """The loss became NaN/inf; the trial cannot continue. `epoch`, `step` (micro-step), `value`."""

    def __init__(self, message: str, *, epoch: int, step: int, value: float):
        super().__init__(message)
        self.epoch = epoch
        self.step = step
        self.value = value


class LossWatch:
    """Raises NonFiniteLossError for the first NaN/inf training loss (see CUDA_NONFINITE_CHECK_EVERY)."""

    def __init__(self, device: torch.device, amp: str, inject_nan_at_step: int | None):
        self.every = 1 if device.type == "cpu" else CUDA_NONFINITE_CHECK_EVERY
        self.amp = amp
        self.inject_nan_at_step = inject_nan_at_step
        self.pending: list[tuple[int, int, int, torch.Tensor]] = []

    def add(self, epoch: int, micro_step: int, global_step: int, loss: torch.Tensor) -> None:
        self.pending.append((epoch, micro_step, global_step, loss.detach()))
        if len(self.pending) >= self.every:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        finite = torch.isfinite(torch.stack([loss.float() for *_, loss in self.pending]))
        if not bool(finite.all()):  # the only host-device sync here
            epoch, step, opt_step, loss = self.pending[int((~finite).nonzero()[0])]
            value = float(loss)
            msg = (
                f"training loss is {value} at epoch {epoch}, micro-step {step} "
                f"(0-based, counted from the start of training; optimizer step {opt_step})."
            )
            if step == self.inject_nan_at_step:
                msg += " It was injected (inject_nan_at_step)."
            if self.amp == "fp16":
                msg += " Under fp16 autocast values overflow easily: try amp=bf16 or amp=off."
            msg += " Lower the lr, set grad_clip_norm, or check the inputs for NaN/inf."
            self.pending.clear()
            raise NonFiniteLossError(msg, epoch=epoch, step=step, value=value)
        self.pending.clear()


def check_val_loss(val_loss: float, *, epoch: int, micro_step: int, amp: str) -> None:
    """A NaN/inf validation loss means the weights have diverged: stop with the fixes to try."""
    if math.isfinite(val_loss):
        return
    raise NonFiniteLossError(
        f"validation loss is {val_loss} after epoch {epoch}: the weights have diverged "
        "(lower the lr or set grad_clip_norm" + ("; or try amp=bf16/off" if amp == "fp16" else "") + ")",
        epoch=epoch,
        step=micro_step,
        value=val_loss,
    )
