"""What an own training loop's calls on its trial must look like, and the one line when they do not.

A mistake in how `train(config, trial)` calls the trial (an epoch that is not a number, a metric that
is not one, a checkpoint holding a numpy value, a model that takes only one batch size) is the same in
every trial of the study: it is a ContractError, which fails the trial with one line and stops the
study at once (the failure budget is for trials that fail by their own chance, not for a loop that
cannot run). The trial object (trial.py) numbers epochs with EpochNumbers, in a trial process and in
`hpolab reproduce` alike (analysis/replay_trial.py runs the same object).

Epochs: the records count them from 1 (MLflow's step, Optuna's intermediate step, the budget). A loop
that counts from 0 (`for epoch in range(n)`, Optuna's own step convention) is recognised by its first
report, epoch 0: its epoch e is recorded as e + 1, and a resumed attempt's `trial.start_epoch` counts
as it does. `trial.report(metrics)` without an epoch reports the next one.
"""

from __future__ import annotations

import collections
import operator
from typing import Any

import torch

# What torch.load(weights_only=True) reads back (retries load checkpoints as data only, running no code)
# (exact types: it refuses subclasses, numpy's float64 among them)
PLAIN = (str, bytes, int, float, bool, complex, type(None), torch.Tensor, torch.nn.Parameter, torch.dtype, torch.device, torch.Size)
OTHER_BATCH = 3  # rows the model given to trial.log_model must also take (its example has one or two)


class TrialFailure(Exception):
    """The trial fails with this one line (no traceback: it is the experiment's contract, not a bug)."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


class ContractError(TrialFailure):
    """The loop called its trial in a way no trial of the study can run with: the study stops at once."""

    def __init__(self, reason: str):
        super().__init__("contract", reason)


class EpochNumbers:
    """The loop's epoch numbers -> the records' (1-based, going up)."""

    def __init__(self, base: int | None = None):
        self.base = base  # 0 or 1: how the loop counts (None: not known before its first report)

    def record(self, epoch: Any, last: int, start: int) -> int:
        """The recorded epoch of a report (`epoch` None: the one after `last`); ContractError when it is
        not a whole number or does not go up. `start`: the attempt's trial.start_epoch (for the line)."""
        if epoch is None:
            if self.base is None:
                self.base = 1
            return last + 1
        try:
            n = operator.index(epoch)  # an int (numpy's and 0-d integer tensors too), not a float
        except TypeError:
            n = -1
        if isinstance(epoch, bool) or n < 0:
            raise ContractError(f"trial.report: epoch must be a whole number (the loop's epoch counter), got {epoch!r}; "
                                "or call trial.report(metrics) to report the next epoch")
        if self.base is None:
            self.base = 0 if n == 0 else 1
        recorded = n + 1 - self.base
        if recorded <= last:
            raise ContractError(f"trial.report: epoch {n} was reported already (the last was {last - 1 + self.base}); epochs "
                                f"go up, and a resumed attempt starts at trial.start_epoch ({start})")
        return recorded

    def recorded_of(self, loop_epoch: int) -> int:
        """The recorded number of one of the loop's epochs."""
        return int(loop_epoch) + 1 - (self.base if self.base is not None else 1)

    def loop_epoch(self, recorded: int) -> int:
        """The loop's own number of a recorded epoch."""
        return recorded - 1 + (self.base if self.base is not None else 1)


def plain_metrics(metrics: Any) -> dict[str, float]:
    if not isinstance(metrics, dict):
        raise ContractError(f"trial.report: metrics must be a dict of name -> number, got {type(metrics).__name__}")
    out = {}
    for k, v in metrics.items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            raise ContractError(f"trial.report: metric {k!r} is not a number ({type(v).__name__})") from None
    out.pop("epoch", None)  # the epoch is the step, not a metric
    return out


def check_plain(value: Any, where: str) -> None:
    """Tensors, numbers, strings and containers of them: what a retry can load as data only."""
    if type(value) in (dict, collections.OrderedDict):
        for k, v in value.items():
            check_plain(k, f"{where} key")
            check_plain(v, f"{where}[{k!r}]")
    elif type(value) in (list, tuple, set):
        for i, v in enumerate(value):
            check_plain(v, f"{where}[{i}]")
    elif type(value) not in PLAIN:
        raise ContractError(f"trial.checkpoint: {where} is a {type(value).__module__}.{type(value).__name__}; a checkpoint holds "
                            "tensors, numbers, strings and dicts/lists of them (state_dict()s; float() or torch.as_tensor "
                            "for numpy values), which a retry loads as data only")


def plain_params(params: Any) -> dict[str, str]:
    """trial.log_params' values as MLflow params (strings); ContractError for anything else."""
    if not isinstance(params, dict):
        raise ContractError(f"trial.log_params takes a dict of name -> value, got {type(params).__name__}")
    out = {}
    for k, v in params.items():
        if not isinstance(v, (str, int, float, bool, type(None))):
            raise ContractError(f"trial.log_params: {k!r} is a {type(v).__name__}; give strings, numbers or booleans")
        out[str(k)] = str(v)
    return out


def model_example(model: Any, input_example: Any) -> torch.Tensor:
    """The example trial.log_model keeps: at least two rows (an MLflow model exported from a one-row
    example takes one row only: torch.export fixes a dimension of size 1), checked now on the model
    with another batch size; ContractError when the model cannot take it."""
    if not isinstance(model, torch.nn.Module):
        raise ContractError(f"trial.log_model takes a torch.nn.Module, got {type(model).__name__}")
    example = torch.as_tensor(input_example).detach().to("cpu")
    if example.dim() == 0 or len(example) == 0:
        raise ContractError(f"trial.log_model: the input example must be a batch (rows along the first dimension), got shape "
                            f"{tuple(example.shape)}")
    if len(example) == 1:
        example = torch.cat([example, example])
    _run(model, example, "cannot run on its input example", "give an example the model takes, as a batch")
    _run(model, torch.cat([example] * OTHER_BATCH)[:OTHER_BATCH], f"cannot take a batch of {OTHER_BATCH} rows",
         "a logged model must take any batch size (promote and predict send other ones)")
    return example


def _run(model: Any, rows: torch.Tensor, what: str, fix: str) -> None:
    try:
        with torch.inference_mode():
            model(rows)
    except Exception as e:  # noqa: BLE001 -- the model's own error, shortened to one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ContractError(f"trial.log_model: the model {what} ({type(e).__name__}: {first}); {fix}") from None
