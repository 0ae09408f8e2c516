"""Handwritten digits, trained by your own loop: plain PyTorch with its own optimizer (AdamW) and
schedule (cosine), run by hpolab as a trial. Instead of build_model/load_data it defines
`train(config, trial)`; hpolab keeps the rest (a process per trial, MLflow, pruning, retries from the
last checkpoint, workers). docs/how-to/own-loop.md explains each call.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hpolab.train.sklearn_data import load_digits  # scikit-learn's bundled 8x8 digits, read without importing sklearn

MODEL_DEFAULTS = {"hidden": 64, "dropout": 0.1}  # the keys the spec's model: may set
METRIC_DIRECTIONS = {"val_acc": "maximize", "val_loss": "minimize"}  # what train() reports (checked against the spec)
SPLIT_SEED = 0  # the same train/val/test split for every trial (and for evaluate)


def splits() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    images, target = load_digits()
    x = torch.tensor(images.reshape(len(images), -1), dtype=torch.float32) / 16.0  # pixels 0..16 -> 0..1
    y = torch.tensor(target, dtype=torch.long)
    idx = torch.from_numpy(np.random.default_rng(SPLIT_SEED).permutation(len(y)))
    parts = {"val": idx[:360], "test": idx[360:720], "train": idx[720:]}
    return {name: (x[i], y[i]) for name, i in parts.items()}


def build(model: dict) -> nn.Module:
    return nn.Sequential(nn.Linear(64, model["hidden"]), nn.ReLU(), nn.Dropout(model["dropout"]), nn.Linear(model["hidden"], 10))


@torch.no_grad()
def evaluate(model: nn.Module, split: str) -> dict[str, float]:
    """Loss and accuracy of `model` on a split ("val", "test")."""
    x, y = splits()[split]
    device = next(model.parameters()).device
    logits = model.eval()(x.to(device))
    return {"loss": F.cross_entropy(logits, y.to(device)).item(), "acc": (logits.argmax(1).cpu() == y).float().mean().item()}


def train(config: dict, trial) -> None:
    t = config["trainer"]  # the spec's trainer: values, sampled ones included (trial.params lists those)
    model = build(config["model"]).to(trial.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=t["lr"], weight_decay=t["weight_decay"])
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=t["max_epochs"])  # one step per epoch
    state = trial.restore()  # an earlier attempt's last checkpoint (a retry), else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        trial.apply_config_changes(optimizer, [schedule])  # a trial scheduler's new lr (PBT's explore); nothing otherwise
    x, y = (v.to(trial.device) for v in splits()["train"])
    for epoch in range(trial.start_epoch, t["max_epochs"] + 1):
        model.train()
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(config["seed"] * 1000 + epoch))
        for batch in order.to(trial.device).split(t["batch_size"]):
            loss = F.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        schedule.step()
        val = evaluate(model, "val")
        metrics = {"train_loss": loss.item(), "val_loss": val["loss"], "val_acc": val["acc"], "lr": schedule.get_last_lr()[0]}
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict()}
        if trial.report(epoch, metrics, checkpoint=state):  # True: pruned, or the study is stopping
            return
        if trial.is_best:  # keep the best epoch's weights: logged after train() returns (per the spec's log_models)
            trial.log_model(model, splits()["val"][0][:2])
