"""Why fit() stops: early stopping, its caller's on_epoch, and a caller that answers each epoch later
(stop_requested, as a trial process does).

Tiny models on tiny synthetic tensors, the helpers of test_train_loop.py.
"""

from __future__ import annotations

import pytest

from hpolab.train import fit, load_checkpoint
from hpolab.train.loop import epoch_metric_names
from test_train_loop import cfg, mlp, splits

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # (conftest: tiny models, one intra-op thread)


def test_early_stopping(tmp_path):
    # min_delta larger than any possible change of val_loss: no epoch after the first counts.
    result = fit(
        cfg(max_epochs=10, early_stopping_patience=2, early_stopping_min_delta=100.0),
        mlp(),
        splits(),
        metric="val_loss",
        direction="minimize",
        checkpoint_dir=tmp_path,
    )
    assert result.stop_reason == "early_stopping" and result.epochs_run == 3
    # The best checkpoint tracks any improvement (min_delta only gates early stopping).
    assert result.best_value == min(h["val_loss"] for h in result.history)
    assert result.best_checkpoint == tmp_path / "best.pt"
    assert load_checkpoint(result.best_checkpoint)["epoch"] == result.best_epoch


def test_on_epoch_runs_after_checkpoints_and_can_stop(tmp_path):
    seen = []

    def on_epoch(epoch, metrics):
        seen.append((epoch, load_checkpoint(tmp_path / "last.pt")["epoch"], sorted(metrics)))
        return epoch == 2

    result = fit(cfg(max_epochs=5), mlp(), splits(), on_epoch=on_epoch, checkpoint_dir=tmp_path)
    assert result.stop_reason == "stopped_by_caller" and result.epochs_run == 2
    assert [(e, c) for e, c, _ in seen] == [(1, 1), (2, 2)]
    assert seen[0][2] == sorted(epoch_metric_names(cfg(), 4))
    assert result.last_checkpoint == tmp_path / "last.pt"


class LateAnswers:
    """A caller that answers each epoch later (as a trial process does: trial_process.EpochAnswers):
    its answer to epoch `stop_after` is "stop", and it arrives after `answer_after_polls` polls."""

    def __init__(self, ckpt_dir, stop_after: int, answer_after_polls: int):
        self.ckpt_dir, self.stop_after, self.answer_after_polls = ckpt_dir, stop_after, answer_after_polls
        self.sent: list[int] = []
        self.polls = 0
        self.waits: list[tuple[int, int]] = []  # (epoch answered, the epoch last.pt holds when fit waits)
        self.answered = 0

    def on_epoch(self, epoch, metrics):
        self.sent.append(epoch)
        self.polls = 0
        return False  # answers come through stop_requested

    def stop_requested(self, wait):
        if self.sent and self.answered < self.sent[-1]:
            if wait:
                self.waits.append((self.sent[-1], load_checkpoint(self.ckpt_dir / "last.pt")["epoch"]))
            else:
                self.polls += 1
            if wait or self.polls > self.answer_after_polls:
                self.answered = self.sent[-1]
        return self.answered >= self.stop_after


def test_a_late_stop_abandons_the_epoch_in_progress_unrecorded(tmp_path):
    data = splits()  # 96 samples: 3 batches of 32 per epoch
    caller = LateAnswers(tmp_path, stop_after=2, answer_after_polls=1)
    result = fit(cfg(max_epochs=5, batch_size=32), mlp(), data, on_epoch=caller.on_epoch, stop_requested=caller.stop_requested,
                 checkpoint_dir=tmp_path)
    # epoch 3 started while the answer to epoch 2 was on its way; it was abandoned after a batch
    assert caller.sent == [1, 2] and result.stop_reason == "stopped_by_caller"
    assert result.epochs_run == 2 and [h["epoch"] for h in result.history] == [1, 2]
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 2
    # the answer to epoch 1 was read during epoch 2's batches, so fit never had to wait for one
    assert caller.waits == []


def test_fit_waits_for_a_late_answer_before_the_checkpoints_it_concerns_are_overwritten(tmp_path):
    caller = LateAnswers(tmp_path, stop_after=3, answer_after_polls=10**6)  # never answers before asked to
    result = fit(cfg(max_epochs=5, batch_size=32), mlp(), splits(), on_epoch=caller.on_epoch, stop_requested=caller.stop_requested,
                 checkpoint_dir=tmp_path)
    # the answer to epoch k is waited for after epoch k+1 trained, while last.pt still holds epoch k;
    # epoch 4 trained in full, then the "stop" to epoch 3 discarded it
    assert caller.waits == [(1, 1), (2, 2), (3, 3)]
    assert result.stop_reason == "stopped_by_caller" and result.epochs_run == 3
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 3


@pytest.mark.parametrize("stop_after, reason", [(3, "stopped_by_caller"), (99, "max_epochs")])
def test_the_answer_to_the_last_epoch_is_read_before_fit_returns(tmp_path, stop_after, reason):
    caller = LateAnswers(tmp_path, stop_after=stop_after, answer_after_polls=10**6)
    result = fit(cfg(max_epochs=3, batch_size=32), mlp(), splits(), on_epoch=caller.on_epoch, stop_requested=caller.stop_requested,
                 checkpoint_dir=tmp_path)
    assert caller.answered == 3 and caller.waits[-1] == (3, 3)
    assert result.stop_reason == reason and result.epochs_run == 3
