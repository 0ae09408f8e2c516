"""An own training loop for the tests: a real tiny model, metrics the test decides, faults on request.

Its model: keys pass through as the spec gives them (no MODEL_DEFAULTS):
  quality      val_acc after epoch e is quality * e / max_epochs (the test picks what is pruned)
  sleep        seconds per epoch (slow enough to kill the driver mid-trial)
  metric_name  the name val_acc is reported under (another: the reports never carry the study metric)
  log_model    whether train() calls trial.log_model (bad_example: with an input the model cannot take;
               unexportable: a model torch.export cannot trace, its branch depends on the data)
  raise_at     an epoch at which train() raises (0: never)
  curve        val_acc of each epoch (a list; instead of quality's line)
  mark         whether the model's bias is set to the epoch after each epoch (which epoch's weights a
               logged model holds is then what it predicts on zeros)
  checkpoint   whether reports carry a checkpoint (default true)
  keep         "best": trial.log_model after each report that is the best so far (default: once, at the end)
  changes      "apply": a resumed attempt calls trial.apply_config_changes(optimizer) after restoring it
  val_loss     a val_loss reported every epoch (none by default)
  amp          what train() tells trial.describe(amp=...) (its run's tag hpolab.amp; none by default)
Every epoch also reports `opt_lr`, the learning rate the optimizer trained it with.
Every epoch reports `steps` (optimizer steps so far, carried in the checkpoint's state: it equals the
epoch only when a resumed attempt restored it) and `start_epoch` (trial.start_epoch of this attempt).
"""

from __future__ import annotations

import time

import torch
from torch import nn

METRIC_NAMES = ("val_acc", "train_loss", "steps", "start_epoch", "opt_lr")


def train(config: dict, trial) -> None:
    m, t = config["model"], config["trainer"]
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=t["lr"])
    steps = 0
    if "amp" in m:
        trial.describe(amp=m["amp"])
    state = trial.restore()
    if state is not None:
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        steps = int(state["steps"])
        if m.get("changes") == "apply":  # a trial scheduler's new lr for the restored optimizer
            trial.apply_config_changes(opt)
    for epoch in range(trial.start_epoch, t["max_epochs"] + 1):
        time.sleep(float(m.get("sleep", 0)))
        if epoch == int(m.get("raise_at", 0)):
            raise RuntimeError(f"the loop raised on purpose at epoch {epoch}")
        loss = net(torch.randn(8, 4, device=trial.device)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        if m.get("mark"):
            with torch.no_grad():
                net.bias.fill_(float(epoch))
        value = m["curve"][epoch - 1] if m.get("curve") else float(m.get("quality", 0.5)) * epoch / t["max_epochs"]
        metrics = {m.get("metric_name", "val_acc"): value, "train_loss": loss.item(), "steps": steps, "start_epoch": trial.start_epoch,
                   "opt_lr": opt.param_groups[0]["lr"], **({"val_loss": float(m["val_loss"])} if "val_loss" in m else {})}
        state = {"model": net.state_dict(), "optimizer": opt.state_dict(), "steps": steps} if m.get("checkpoint", True) else None
        if trial.report(epoch, metrics, checkpoint=state):
            return
        if m.get("keep") == "best" and trial.is_best:  # the best epoch's weights, not the last one's
            trial.log_model(net, torch.zeros(2, 4))
    if m.get("log_model", True) and m.get("keep") != "best":
        model = DataBranch(net) if m.get("log_model") == "unexportable" else net
        trial.log_model(model, torch.zeros(2, 3 if m.get("log_model") == "bad_example" else 4))


class DataBranch(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x) if x.sum() >= 0 else -self.net(x)  # a branch on the data: torch.export cannot trace it
