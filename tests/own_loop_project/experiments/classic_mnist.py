"""PyTorch's classic MNIST example (pytorch/examples, mnist/main.py) as a user brings it under hpolab:
its Net, its train/test functions (the epoch function renamed: `train` is hpolab's entry point), its
Adadelta and StepLR, its prints. Tiny synthetic 1x8x8 "images" of 4 classes stand in for MNIST
(nothing can be downloaded): the class is the brightest quadrant.

Its model: keys (no MODEL_DEFAULTS) are the test's knobs:
  epochs_from   1: `for epoch in range(1, n + 1)` (the example's); 0: `for epoch in range(n)`;
                "none": trial.report(metrics) without an epoch
  example_rows  rows of the input example given to trial.log_model (the example's habit: x[0:1])
  keep          "final": trial.log_model after the loop; "best": after each report where trial.is_best
  bad_report    "epoch": reports the epoch as a string (a contract error)
  write         a relative path train() writes its test loss to, each epoch
  fail_at       an epoch after which train() raises (after printing a line)
  log_params    whether train() records its optimizer and schedule with trial.log_params
"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(4 * 3 * 3, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def loaders(batch_size: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(320, 1, 8, 8, generator=g)
    y = torch.stack([x[:, 0, :4, :4].sum((1, 2)), x[:, 0, :4, 4:].sum((1, 2)), x[:, 0, 4:, :4].sum((1, 2)),
                     x[:, 0, 4:, 4:].sum((1, 2))], 1).argmax(1)
    train_set, test_set = TensorDataset(x[:256], y[:256]), TensorDataset(x[256:], y[256:])
    return DataLoader(train_set, batch_size=batch_size, shuffle=True, generator=g), DataLoader(test_set, batch_size=1000)


def train_epoch(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % 4 == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]\tLoss: {loss.item():.6f}")


def test(model, device, test_loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    test_loss /= len(test_loader.dataset)
    print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{len(test_loader.dataset)}\n")
    return test_loss, correct / len(test_loader.dataset)


def train(config, trial):
    t, knobs = config["trainer"], config["model"]
    device = trial.device
    train_loader, test_loader = loaders(t["batch_size"], config["seed"])
    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=t["lr"])
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    if knobs.get("log_params"):
        trial.log_params({"optimizer": "adadelta", "scheduler": "step(gamma=0.7)"})
    base = knobs.get("epochs_from", 1)
    first = 0 if base == 0 else 1
    for epoch in range(first, first + t["max_epochs"]):
        train_epoch(None, model, device, train_loader, optimizer, epoch)
        loss, acc = test(model, device, test_loader)
        scheduler.step()
        if knobs.get("write"):
            with open(knobs["write"], "a") as f:
                f.write(f"{trial.number} {epoch} {loss}\n")
        if epoch == knobs.get("fail_at"):
            print(f"about to fail after epoch {epoch}", file=sys.stderr)
            raise RuntimeError("the loop failed on purpose")
        metrics = {"val_loss": loss, "val_acc": acc}
        if knobs.get("bad_report") == "epoch":
            stop = trial.report(str(epoch), metrics)
        elif base == "none":
            stop = trial.report(metrics)
        else:
            stop = trial.report(epoch, metrics)
        if stop:
            return
        if knobs.get("keep") == "best" and trial.is_best:
            trial.log_model(model, next(iter(test_loader))[0][: knobs.get("example_rows", 2)])
    if knobs.get("keep", "final") == "final":
        trial.log_model(model, next(iter(test_loader))[0][: knobs.get("example_rows", 2)])


def evaluate(model, split):
    """Loss and accuracy of a logged model on the test images (promote's gate)."""
    _, test_loader = loaders(64)
    x, y = next(iter(test_loader))
    with torch.no_grad():
        out = model.eval()(x)
    return {"loss": F.nll_loss(out, y).item(), "acc": out.argmax(1).eq(y).float().mean().item()}
