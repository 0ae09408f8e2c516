"""A logged model as the experiment's own code expects a module.

MLflow 3 saves a pytorch model in the "pt2" format (torch.export) by default, and loads it back as a
graph module whose eval() / train() raise NotImplementedError ("Calling eval() is not supported yet").
An own-loop experiment's `evaluate(model, split)` is ordinary PyTorch code that calls model.eval()
first. The graph was exported in eval mode (trial.log_model keeps an eval copy), so switching modes
has nothing to do: this wrapper makes both a no-op and forwards everything else.
"""

from __future__ import annotations

from torch import nn


class ExportedModule(nn.Module):
    """forward, parameters(), buffers() of the exported graph; eval()/train() only set the flag."""

    def __init__(self, exported: nn.Module):
        super().__init__()
        self.exported = exported

    def forward(self, *args, **kwargs):
        return self.exported(*args, **kwargs)

    def train(self, mode: bool = True) -> "ExportedModule":
        self.training = mode  # the graph's behaviour was fixed (eval) when it was exported
        return self


def as_module(model) -> nn.Module:
    """`model` when its eval() works, else wrapped (ExportedModule); in eval mode either way."""
    try:
        return model.eval()
    except (NotImplementedError, AttributeError):
        return ExportedModule(model).eval()

