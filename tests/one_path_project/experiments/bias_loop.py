"""bias_routine.py's model and data, trained by its own loop (`train(config, trial)`): plain SGD over
batches of `trainer.batch_size` rows in order, the metrics the routine logs for it (train_loss, val_loss, val_score, val_pred,
lr: the learning rate the optimizer trained the epoch with), the best epoch's weights logged."""

from __future__ import annotations

import torch

from experiments import bias_routine as twin  # (its module, not its build_model: an own loop defines none)
from experiments.bias_routine import DATA_DEFAULTS, METRIC_DIRECTIONS, MODEL_DEFAULTS, load_data, loss, metrics  # noqa: F401


def train(config: dict, trial) -> None:
    t = config["trainer"]
    data = load_data(config["data"], config["seed"])
    (x, y), (x_val, y_val) = data.train.tensors, data.val.tensors
    model = twin.build_model(config["model"], data.input_shape, data.num_classes).to(trial.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=t["lr"], momentum=t["momentum"], weight_decay=t["weight_decay"])
    state = trial.restore()
    if state is not None:  # a retry or a resumed trial: go on from its checkpoint
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        trial.apply_config_changes(optimizer)  # a trial scheduler's new lr (PBT's explore); nothing otherwise
    for epoch in range(trial.start_epoch, t["max_epochs"] + 1):
        lr = optimizer.param_groups[0]["lr"]
        model.train()
        losses = []
        for rows in torch.arange(len(y)).split(t["batch_size"]):
            batch_loss = loss(model(x[rows]), y[rows])
            optimizer.zero_grad()
            batch_loss.backward()
            optimizer.step()
            losses.append(batch_loss.item())
        with torch.no_grad():
            out = model.eval()(x_val)
        val = metrics(out, y_val)
        reported = {"train_loss": sum(losses) / len(losses), "val_loss": loss(out, y_val).item(), "val_score": val["score"],
                    "val_pred": val["pred"], "lr": lr}
        if trial.report(epoch, reported, checkpoint={"model": model.state_dict(), "optimizer": optimizer.state_dict()}):
            return
        if trial.is_best:
            trial.log_model(model, x_val[:2])


def evaluate(model: torch.nn.Module, split: str) -> dict[str, float]:
    """The model's loss and score on a split ("test"), at the default target: promote's gate."""
    x, y = getattr(load_data(DATA_DEFAULTS, 0), split).tensors
    with torch.no_grad():
        out = model.eval()(x)
    return {"loss": loss(out, y).item(), **metrics(out, y)}
