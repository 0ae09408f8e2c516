"""A LightningModule as Lightning's own examples write one (a classifier logging `train_loss` on step and
epoch, a default Trainer: progress bar, model summary, logger), with the two lines the Lightning how-to
adds: HpolabCallback(trial) and ckpt_path=resume_path(trial). Synthetic data: 8 features, 3 classes.
It also logs `opt_lr`, the learning rate its optimizer holds, so a test sees what a resume trained with.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpolab.integrations.lightning import HpolabCallback, resume_path


class LitClassifier(L.LightningModule):
    def __init__(self, hidden_dim: int = 16, learning_rate: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.l1 = nn.Linear(8, self.hparams.hidden_dim)
        self.l2 = nn.Linear(self.hparams.hidden_dim, 3)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True)  # on_step too (training_step's default)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())
        self.log("opt_lr", self.trainer.optimizers[0].param_groups[0]["lr"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.learning_rate, momentum=0.9)


def loaders(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(192, 8, generator=g)
    y = (x[:, 0] > 0.5).long() + (x[:, 1] > 0).long()
    return (DataLoader(TensorDataset(x[:128], y[:128]), batch_size=32, shuffle=True, generator=g),
            DataLoader(TensorDataset(x[128:], y[128:]), batch_size=64), x[128:130])


def train(config, trial):
    t = config["trainer"]
    L.seed_everything(config["seed"])
    train_loader, val_loader, example = loaders(config["seed"])
    model = LitClassifier(learning_rate=t["lr"])
    trainer = L.Trainer(max_epochs=t["max_epochs"], accelerator="gpu" if trial.device.type == "cuda" else "cpu", devices=1,
                        enable_checkpointing=False, callbacks=[HpolabCallback(trial)])
    trainer.fit(model, train_loader, val_loader, ckpt_path=resume_path(trial))
    trial.log_model(model, example)
