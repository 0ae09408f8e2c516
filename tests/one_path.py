"""What tests/test_one_path*.py share: the two kinds of experiment that train the same model on the same
data (tests/one_path_project: bias_routine.py by the routine, bias_loop.py by its own loop), a study of
either through the real CLI, and the arithmetic their records must follow.

The model is one bias b, from 0, trained towards 1.0 by plain SGD on batches that are all alike, so
each epoch's records say from which weights it trained and with which learning rate. With s steps an
epoch (8 rows / trainer.batch_size), each step multiplies 1 - b by q = 1 - 2 * lr_k:
  train_loss of epoch k = mean over its steps i of (1 - b) ** 2 * q ** (2 * i)   (b: the weights it started
                          from, a fresh model's b is 0; lr_k: the `lr` it logged)
  val_pred of epoch k   = 1 - (1 - b) * q ** s                                    (the weights it ended with)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli

PROJECT = Path(__file__).parent / "one_path_project"
SPEC = str(PROJECT / "studies" / "bias.yaml")
KINDS = {"routine": "bias_routine", "own_loop": "bias_loop"}  # kind -> the experiment the spec runs
RECORDED = ("train_loss", "val_loss", "val_score", "val_pred", "lr")  # what both kinds log every epoch


def study_run(store: Path, kind: str, *args: str, check: bool = True):
    """`hpolab study run` of the bias spec, trained by the kind's experiment (from another working directory)."""
    return run_cli("--store", str(store), "study", "run", SPEC, f"experiment={KINDS[kind]}", "--hide-trial-output", *args,
                   cwd=PROJECT.parent, check=check)


def records(client, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Each metric both kinds log: every (step, value) the run has, by step (a repeated step shows twice)."""
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in RECORDED}


def assert_one_curve(recorded: dict[str, list[tuple[int, float]]], epochs: int) -> None:
    """Every metric at steps 1..epochs, once each: no gap, no repeat."""
    for key, points in recorded.items():
        assert [step for step, _ in points] == list(range(1, epochs + 1)), (key, points)


def assert_each_epoch_went_on_from_the_last(recorded: dict[str, list[tuple[int, float]]], start: dict[int, float] | None = None,
                                            steps: int = 1) -> None:
    """Each epoch trained from the weights the epoch before it ended with (a fresh model before epoch 1),
    `steps` steps with the learning rate it logged. `start`: epoch -> the bias it must have started from
    instead (a PBT member that copied another member's checkpoint)."""
    b = 0.0
    for (k, loss), (_, pred), (_, lr) in zip(recorded["train_loss"], recorded["val_pred"], recorded["lr"]):
        b, q = (start or {}).get(k, b), 1 - 2 * lr
        assert loss == pytest.approx(sum((1 - b) ** 2 * q ** (2 * i) for i in range(steps)) / steps, rel=1e-5, abs=1e-7), (k, recorded)
        assert pred == pytest.approx(1 - (1 - b) * q ** steps, rel=1e-5, abs=1e-7), (k, recorded)
        b = pred
