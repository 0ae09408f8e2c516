"""An own training loop for the tests: a real tiny model, metrics the test decides, faults on request.

Its model: keys pass through as the spec gives them (no MODEL_DEFAULTS):
  quality      val_acc after epoch e is quality * e / max_epochs (the test picks what is pruned)
  sleep        seconds per epoch (slow enough to kill the driver mid-trial)
  metric_name  the name val_acc is reported under (another: the reports never carry the study metric)
  log_model    whether train() calls trial.log_model (bad_example: with an input the model cannot take)
  raise_at     an epoch at which train() raises (0: never)
Every epoch reports `steps` (optimizer steps so far, carried in the checkpoint's state: it equals the
epoch only when a resumed attempt restored it) and `start_epoch` (trial.start_epoch of this attempt).
"""

from __future__ import annotations

import time

import torch
from torch import nn

METRIC_NAMES = ("val_acc", "train_loss", "steps", "start_epoch")


def train(config: dict, trial) -> None:
    m, t = config["model"], config["trainer"]
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=t["lr"])
    steps = 0
    state = trial.restore()
    if state is not None:
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        steps = int(state["steps"])
    for epoch in range(trial.start_epoch, t["max_epochs"] + 1):
        time.sleep(float(m.get("sleep", 0)))
        if epoch == int(m.get("raise_at", 0)):
            raise RuntimeError(f"the loop raised on purpose at epoch {epoch}")
        loss = net(torch.randn(8, 4, device=trial.device)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        metrics = {m.get("metric_name", "val_acc"): float(m.get("quality", 0.5)) * epoch / t["max_epochs"],
                   "train_loss": loss.item(), "steps": steps, "start_epoch": trial.start_epoch}
        if trial.report(epoch, metrics, checkpoint={"model": net.state_dict(), "optimizer": opt.state_dict(), "steps": steps}):
            return
    if m.get("log_model", True):
        trial.log_model(net, torch.zeros(2, 3 if m.get("log_model") == "bad_example" else 4))
