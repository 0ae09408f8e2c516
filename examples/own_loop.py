"""Tune your own PyTorch training loop from Python: run a study, look at its trials, promote the best
model, predict with it.

experiments/digits_own_loop.py is a plain PyTorch loop (its own optimizer and schedule) that defines
`train(config, trial)`; studies/digits_own_loop.yaml searches its learning rate, weight decay, width
and dropout, and prunes trials the median pruner finds behind after their second epoch. Each trial
runs in its own process and is logged to MLflow, as with `hpolab study run`.

Run it from the project folder (the study lives in ./mlruns, or in the folder HPOLAB_STORE names):

    python examples/own_loop.py                          # the spec as written: 12 trials of 8 epochs
    python examples/own_loop.py n_trials=6 trainer.max_epochs=4

Run it again and the study continues up to its n_trials (Ctrl-C stops it; the next run resumes).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hpolab
from hpolab.train.sklearn_data import load_digits

SPEC = Path(__file__).resolve().parents[1] / "studies" / "digits_own_loop.yaml"


def main(overrides: list[str]) -> None:
    # 1. The study: trials in their own processes, pruning, everything in MLflow (as `hpolab study run`).
    study = hpolab.run_study(SPEC, overrides)

    # 2. Its trials, best first: the table `hpolab compare digits-own-loop` prints, as a DataFrame.
    df = study.trials_df()
    columns = ["trial", "state", *[c for c in df.columns if c.startswith("params.")], "best_val_acc", "epochs", "pruned_at_epoch"]
    print(df[columns].to_string(index=False))
    best = study.best
    print(f"best: trial {best.number}, val_acc {best.value:.4f}, {best.params}")

    # 3. Promote the best trial's logged model: the experiment's evaluate(model, "test") is the gate.
    promotion = study.promote()
    if promotion.refused:
        print(f"not promoted: {promotion.model_uri} (version {promotion.version}) stays, it is at least as good")

    # 4. Predict with the promoted model. It takes what train() fed it: 64 pixels scaled to 0..1.
    images, labels = load_digits()
    x = (images[:5].reshape(5, 64) / 16.0).astype("float32")
    predictions = hpolab.predict(promotion.model_uri, x)
    predicted = predictions.filter(like="output_").to_numpy().argmax(axis=1)
    print(predictions.round(2).to_string(index=False))
    print(f"predicted {predicted.tolist()}, true {labels[:5].tolist()}")


if __name__ == "__main__":  # (trial processes never import this file; the guard is for whoever imports it)
    main(sys.argv[1:])
