"""A Hugging Face Trainer script as users write one: a tiny BERT built from a config (a vocabulary of 32
token ids, nothing downloaded), `output_dir="results"` (relative), the Trainer's own progress bars and
logging, with what the Hugging Face how-to adds: HpolabCallback(trial), resume_folder(trial),
trial.log_model(LogitsModel(model), ...). Its model: keys are knobs:
  load_best   TrainingArguments(load_best_model_at_end=...): the Trainer ends on its best checkpoint
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from hpolab.integrations.transformers import HpolabCallback, LogitsModel, resume_folder

VOCAB, LENGTH = 32, 8


def dataset(n: int, seed: int) -> list[dict]:
    ids = np.random.default_rng(seed).integers(2, VOCAB, size=(n, LENGTH))
    labels = (ids < 17).sum(1) > LENGTH // 2  # more low ids than high ones
    return [{"input_ids": torch.tensor(i), "labels": torch.tensor(int(y))} for i, y in zip(ids, labels)]


def accuracy(pred) -> dict[str, float]:
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def train(config, trial):
    t, knobs = config["trainer"], config["model"]
    torch.manual_seed(config["seed"])
    model = BertForSequenceClassification(BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                     intermediate_size=32, max_position_embeddings=LENGTH, num_labels=2))
    args = TrainingArguments(output_dir="results", eval_strategy="epoch", save_strategy="epoch", logging_strategy="epoch",
                             num_train_epochs=t["max_epochs"], learning_rate=t["lr"], per_device_train_batch_size=16,
                             load_best_model_at_end=bool(knobs.get("load_best", False)), save_total_limit=1,
                             use_cpu=trial.device.type != "cuda", seed=config["seed"], report_to="none")
    val = dataset(64, 1)
    trainer = Trainer(model=model, args=args, train_dataset=dataset(128, config["seed"]), eval_dataset=val,
                      compute_metrics=accuracy, callbacks=[HpolabCallback(trial)])
    trainer.train(resume_from_checkpoint=resume_folder(trial))
    trainer.save_model("results/final")  # a relative path, as scripts do
    trial.log_model(LogitsModel(model.cpu()), torch.stack([v["input_ids"] for v in val[:2]]))


@torch.no_grad()
def evaluate(model, split):
    """The logged model's (LogitsModel: ids -> logits) loss and accuracy on held-out sequences, under the
    Trainer's names (eval_loss, eval_accuracy: the study metric's name too)."""
    held = dataset(64, 2)
    logits = model.eval()(torch.stack([h["input_ids"] for h in held]))
    y = torch.stack([h["labels"] for h in held])
    return {"eval_loss": torch.nn.functional.cross_entropy(logits, y).item(), "eval_accuracy": (logits.argmax(1) == y).float().mean().item()}
