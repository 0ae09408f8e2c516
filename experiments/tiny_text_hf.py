"""Text classification with a Hugging Face `Trainer`: transformers trains, hpolab tunes, prunes, checkpoints, logs.

An own training loop (`train(config, trial)`): the experiment builds a `transformers.Trainer` and adds
`hpolab.integrations.transformers.HpolabCallback(trial)`, which reports each epoch's evaluation to the
study (and the pruner), stops training when the trial is pruned, and hands the Trainer's checkpoint folder
to the platform each epoch; `resume_folder(trial)` gives a retried or resumed trial that folder back.

Nothing is downloaded: the model is a tiny BERT built from a config (random init), the "text" is
generated from the seed as token ids (no tokenizer): each sequence is [CLS] followed by words, where a
few words carry sentiment (ids 2..21 positive, 22..41 negative; an odd number of them, so no ties) among
neutral filler (42..63), and the label is 1 when positive words outnumber negative ones. A model must
count across the sequence to get it right, which a tiny transformer learns in a few epochs.
`evaluate(model, split)` scores the logged model (ids -> logits) on a test split for `hpolab promote`.
"""

from __future__ import annotations

import numpy as np
import torch
import transformers
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from hpolab.integrations.transformers import HpolabCallback, LogitsModel, resume_folder

# Imports at module level on purpose: the driver's forkserver preloads the experiment (and so
# transformers) once per study, not once per trial.

DATA_DEFAULTS = {
    "n_train": 512,  # sequences
    "n_val": 256,
    "length": 16,  # tokens per sequence, [CLS] included
}
MODEL_DEFAULTS = {
    "hidden": 32,  # BERT hidden size
    "layers": 2,
    "heads": 2,  # hidden must be a multiple of heads
}
METRIC_DIRECTIONS = {"eval_accuracy": "maximize", "eval_loss": "minimize"}  # the Trainer's names: eval_ + compute_metrics'

VOCAB = 64  # 0 = padding (unused), 1 = [CLS], 2..21 positive, 22..41 negative, 42..63 neutral
CLS, POSITIVE, NEGATIVE, NEUTRAL = 1, (2, 22), (22, 42), (42, 64)
TEST_SEED = 2**31 - 1  # evaluate()'s sequences: a generator no study seed shares


def make_sequences(n: int, length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(input ids int64 (n, length), labels int64 (n,)) of the synthetic sentiment task above."""
    words = length - 1
    ids = rng.integers(*NEUTRAL, size=(n, words))
    labels = np.zeros(n, dtype=np.int64)
    for i in range(n):
        k = rng.choice(np.arange(1, min(words, 9) + 1, 2))  # 1, 3, 5, 7 or 9 sentiment words
        n_pos = rng.integers(0, k + 1)
        where = rng.choice(words, size=k, replace=False)
        ids[i, where[:n_pos]] = rng.integers(*POSITIVE, size=n_pos)
        ids[i, where[n_pos:]] = rng.integers(*NEGATIVE, size=k - n_pos)
        labels[i] = int(n_pos > k - n_pos)
    return np.concatenate([np.full((n, 1), CLS), ids], axis=1).astype(np.int64), labels


def load_splits(data: dict, seed: int) -> tuple[list[dict], list[dict]]:
    rng = np.random.default_rng(seed)
    splits = []
    for n in (int(data["n_train"]), int(data["n_val"])):
        ids, labels = make_sequences(n, int(data["length"]), rng)
        splits.append([{"input_ids": torch.from_numpy(x), "labels": torch.tensor(y)} for x, y in zip(ids, labels)])
    return splits[0], splits[1]


def tiny_bert(model: dict, length: int) -> BertForSequenceClassification:
    config = BertConfig(vocab_size=VOCAB, hidden_size=int(model["hidden"]), num_hidden_layers=int(model["layers"]),
                        num_attention_heads=int(model["heads"]), intermediate_size=4 * int(model["hidden"]),
                        max_position_embeddings=length, num_labels=2)
    return BertForSequenceClassification(config)  # random init from the config: nothing to download


@torch.no_grad()
def evaluate(model: torch.nn.Module, split: str) -> dict[str, float]:
    """The logged model's (LogitsModel: ids -> logits) loss and accuracy on 512 sequences generated apart
    from the training ones ("test", for promote's gate; its own seed), at the default length."""
    if split != "test":
        raise ValueError(f"evaluate: only the 'test' split is held out here, not {split!r}")
    ids, labels = make_sequences(512, DATA_DEFAULTS["length"], np.random.default_rng(TEST_SEED))
    logits = model.eval()(torch.from_numpy(ids).to(next(model.parameters()).device)).cpu()
    y = torch.from_numpy(labels)
    return {"eval_loss": torch.nn.functional.cross_entropy(logits, y).item(), "eval_accuracy": (logits.argmax(1) == y).float().mean().item()}


def accuracy(prediction) -> dict[str, float]:
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def train(config: dict, trial) -> None:
    tr, seed = config["trainer"], int(config["seed"])
    transformers.set_seed(seed)  # the model's initial weights
    transformers.logging.set_verbosity_error()  # no per-trial notices
    transformers.utils.logging.disable_progress_bar()  # nor "Writing model shards" bars
    train_set, val_set = load_splits(config["data"], seed)
    model = tiny_bert(config["model"], int(config["data"]["length"]))
    args = TrainingArguments(
        output_dir=str(trial.dir / "hf"),  # the Trainer's checkpoint folders (hpolab keeps its own copy)
        eval_strategy="epoch",  # one report per epoch
        save_strategy="epoch",  # each report carries that epoch's checkpoint
        logging_strategy="epoch",  # so that each report has the epoch's train_loss
        save_total_limit=1,
        num_train_epochs=int(tr["max_epochs"]),
        learning_rate=float(tr["lr"]),  # peak; linear decay to 0 (the Trainer's default schedule)
        weight_decay=float(tr["weight_decay"]),
        per_device_train_batch_size=int(tr["batch_size"]),
        per_device_eval_batch_size=len(val_set),
        use_cpu=trial.device.type != "cuda",  # the device hpolab gave this trial
        seed=seed,
        report_to="none",  # hpolab logs the reported metrics to MLflow
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_set, eval_dataset=val_set, compute_metrics=accuracy,
                      callbacks=[HpolabCallback(trial)])
    trainer.remove_callback(PrinterCallback)  # (prints every log dict when tqdm is off)
    trainer.remove_callback(ProgressCallback)
    trainer.train(resume_from_checkpoint=resume_folder(trial))
    # the logged model: input ids (N, length) int64 -> logits (N, 2), a plain tensor in and out
    example = torch.stack([s["input_ids"] for s in val_set[:8]])
    trial.log_model(LogitsModel(model.cpu()), example)
