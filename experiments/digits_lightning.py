"""Handwritten digits with a LightningModule: Lightning trains, hpolab tunes, prunes, checkpoints and logs.

An own training loop (`train(config, trial)`): the experiment builds a `lightning.Trainer` and adds
`hpolab.integrations.lightning.HpolabCallback(trial)`, which reports each epoch's validation metrics to
the study (and the pruner), stops the fit when the trial is pruned, and hands Lightning's full checkpoint
to the platform each epoch; `resume_path(trial)` gives a retried or resumed trial that checkpoint back.
Data: scikit-learn's bundled 8x8 digits (1,797 images, offline), split once (val, test, train); model:
an MLP. `evaluate(model, split)` scores the logged network on the test split for `hpolab promote`.
"""

from __future__ import annotations

import logging
import warnings

import lightning as L
import numpy as np
import torch
from lightning.pytorch.plugins.environments import LightningEnvironment
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from hpolab.integrations.lightning import HpolabCallback, resume_path
from hpolab.train.sklearn_data import load_digits  # scikit-learn's bundled file, no download

# Imports at module level on purpose: the driver's forkserver preloads the experiment (and so Lightning)
# once per study, not once per trial.

MODEL_DEFAULTS = {
    "hidden": 64,  # width of the hidden layer
    "dropout": 0.1,  # before the classifier
}
METRIC_DIRECTIONS = {"val_acc": "maximize", "val_loss": "minimize"}  # what the module logs in validation_step

PIXEL_MAX = 16.0  # digits pixels are integers 0..16
SPLIT_SEED = 0  # one train/val/test split for every trial and for evaluate()


class DigitsClassifier(L.LightningModule):
    def __init__(self, hidden: int, dropout: float, lr: float, weight_decay: float, max_epochs: int):
        super().__init__()
        self.save_hyperparameters()  # (kept in Lightning's checkpoint)
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 10))
        self.lr, self.weight_decay, self.max_epochs = lr, weight_decay, max_epochs

    def training_step(self, batch, _):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)  # the epoch's mean: what the callback reports
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.max_epochs)  # stepped once per epoch
        return {"optimizer": opt, "lr_scheduler": cosine}


def splits() -> dict[str, TensorDataset]:
    images, target = load_digits()
    x = torch.as_tensor(images.reshape(-1, 64), dtype=torch.float32) / (PIXEL_MAX / 2) - 1.0  # [-1, 1]
    y = torch.as_tensor(target, dtype=torch.int64)
    order = torch.as_tensor(np.random.default_rng(SPLIT_SEED).permutation(len(y)))
    parts = {"val": order[:360], "test": order[360:720], "train": order[720:]}
    return {name: TensorDataset(x[i], y[i]) for name, i in parts.items()}


@torch.no_grad()
def evaluate(model: nn.Module, split: str) -> dict[str, float]:
    """Loss and accuracy of a logged network (module.net) on a split ("test" for promote's gate)."""
    x, y = splits()[split].tensors
    logits = model.eval()(x.to(next(model.parameters()).device)).cpu()
    return {"loss": F.cross_entropy(logits, y).item(), "acc": (logits.argmax(1) == y).float().mean().item()}


def _quiet() -> None:
    """No banner ("GPU available: ...") nor advice that does not apply here in every trial's log."""
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):  # both distributions' names
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")  # in-memory tensors need no workers
    warnings.filterwarnings("ignore", message=".*srun.*")  # hpolab, not srun, starts the trials
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # Lightning's own use of a torch API it will update


def train(config: dict, trial) -> None:
    tr, model, seed = config["trainer"], config["model"], int(config["seed"])
    L.seed_everything(seed, verbose=False)  # initial weights, dropout and shuffling from the study seed
    data = splits()
    train_set, val_set = data["train"], data["val"]
    train_loader = DataLoader(train_set, batch_size=int(tr["batch_size"]), shuffle=True, generator=torch.Generator().manual_seed(seed))
    val_loader = DataLoader(val_set, batch_size=len(val_set))  # one batch: the logged means are exact
    module = DigitsClassifier(int(model["hidden"]), float(model["dropout"]), float(tr["lr"]), float(tr["weight_decay"]), int(tr["max_epochs"]))
    with warnings.catch_warnings():
        _quiet()
        trainer = L.Trainer(
            max_epochs=int(tr["max_epochs"]),
            accelerator="gpu" if trial.device.type == "cuda" else "cpu",  # the device hpolab gave this trial
            devices=1,
            plugins=[LightningEnvironment()],  # hpolab places trials itself: no SLURM/torchrun detection or requeue
            enable_checkpointing=False,  # hpolab keeps the checkpoints (the callback's)
            logger=False,  # hpolab logs the reported metrics to MLflow
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            deterministic=True,
            callbacks=[HpolabCallback(trial)],
        )
        trainer.fit(module, train_loader, val_loader, ckpt_path=resume_path(trial))
    # the logged model: the plain network (no Lightning needed to load and serve it), inputs as preprocessed here
    trial.log_model(module.net, val_set.tensors[0][:8])
