"""The Trial an own training loop talks to, on its own: a real pipe with the driver's side played by
a thread (it answers each epoch), real files; no study."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest
import torch

from hpolab.study.trials.trial import Trial, TrialFailure
from hpolab.study.trials.trial_contract import ContractError
from hpolab.train.checkpoint import CHECKPOINT_FORMAT, load_checkpoint


def _job(tmp_path, resume_from=None, metric="val_acc", direction="maximize") -> dict:
    return {"config": {"metric": metric, "direction": direction, "seed": 0, "trainer": {"device": "cpu", "max_epochs": 5}},
            "checkpoint_dir": str(tmp_path), "resume_from": resume_from, "number": 7, "params": {"trainer.lr": 0.1}}


class Driver:
    """The driver's end of the pipe: records each epoch and answers "stop" from epoch `stop_at` on."""

    def __init__(self, stop_at: int | None = None):
        self.conn, self.child = multiprocessing.Pipe()
        self.epochs: list[tuple[int, dict]] = []
        self.stop_at = stop_at
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                _, epoch, metrics = self.conn.recv()
            except EOFError:
                return
            self.epochs.append((epoch, metrics))
            self.conn.send("stop" if self.stop_at is not None and epoch >= self.stop_at else "continue")


def test_best_epoch_checkpoints_and_a_resumed_attempt(tmp_path):
    driver = Driver()
    trial = Trial(driver.child, _job(tmp_path))
    assert (trial.start_epoch, trial.restore(), trial.number, trial.params) == (1, None, 7, {"trainer.lr": 0.1})
    assert trial.device == torch.device("cpu")
    for epoch, acc in [(1, 0.5), (2, 0.8), (3, 0.7)]:
        assert trial.report(epoch, {"val_acc": torch.tensor(acc), "train_loss": 1.0 / epoch}, checkpoint={"w": torch.ones(2) * epoch}) is False
    assert [e for e, _ in driver.epochs] == [1, 2, 3] and driver.epochs[0][1] == {"val_acc": 0.5, "train_loss": 1.0}
    last, best = load_checkpoint(tmp_path / "last.pt"), load_checkpoint(tmp_path / "best.pt")
    assert last["epoch"] == 3 and [h["epoch"] for h in last["history"]] == [1, 2, 3] and last["format_version"] == CHECKPOINT_FORMAT
    assert best["epoch"] == 2 and torch.equal(best["state"]["w"], torch.ones(2) * 2)  # best.pt: the best epoch's state
    summary = trial.summary(False, None)
    assert (summary["best_value"], summary["best_epoch"], summary["epochs_run"], summary["stop_reason"]) == (pytest.approx(0.8), 2, 3, "returned")

    again = Trial(Driver().child, _job(tmp_path / "retry", resume_from=str(tmp_path / "last.pt")))
    assert again.start_epoch == 4 and torch.equal(again.restore()["w"], torch.ones(2) * 3)
    again.report(4, {"val_acc": 0.9})
    s = again.summary(False, None)
    assert (s["best_value"], s["best_epoch"], s["epochs_run"]) == (0.9, 4, 4)  # over the whole curve, both attempts


def test_a_stop_answer_is_kept_and_later_reports_send_nothing(tmp_path):
    driver = Driver(stop_at=2)
    trial = Trial(driver.child, _job(tmp_path))
    assert trial.report(1, {"val_acc": 0.1}) is False
    assert trial.report(2, {"val_acc": 0.2}) is True
    assert trial.report(3, {"val_acc": 0.3}) is True
    assert [e for e, _ in driver.epochs] == [1, 2]
    assert trial.summary(False, None)["stop_reason"] == "stopped_by_caller"


def test_contract_mistakes_are_named(tmp_path):
    trial = Trial(Driver().child, _job(tmp_path))
    with pytest.raises(ContractError, match=r"state\['extra'\]\['best'\] is a numpy.float64"):
        trial.checkpoint({"w": torch.zeros(1), "extra": {"best": np.float64(0.5)}})
    with pytest.raises(ContractError, match="epoch must be a whole number"):
        trial.report(1.5, {"val_acc": 0.1})
    trial.report(1, {"val_acc": 0.1})
    with pytest.raises(ContractError, match=r"epoch 1 was reported already .* trial.start_epoch \(1\)"):
        trial.report(1, {"val_acc": 0.1})
    with pytest.raises(ContractError, match="metric 'name' is not a number"):
        trial.report(2, {"name": "x"})
    with pytest.raises(ContractError, match="without reporting an epoch"):
        Trial(Driver().child, _job(tmp_path / "none")).summary(False, None)
    with pytest.raises(ContractError, match=r"trial.log_params: 'net' is a Linear"):
        trial.log_params({"net": torch.nn.Linear(1, 1)})


def test_a_loop_counting_from_0_is_recorded_from_1_and_resumes_in_its_own_numbering(tmp_path):
    driver = Driver()
    trial = Trial(driver.child, _job(tmp_path))
    for epoch in range(3):
        trial.report(epoch, {"val_acc": 0.1 * epoch}, checkpoint={"w": torch.ones(1)})
    trial.report({"val_acc": 0.5})  # without an epoch: the next one
    assert [e for e, _ in driver.epochs] == [1, 2, 3, 4]
    trial.checkpoint({"w": torch.ones(1)})
    again = Trial(Driver().child, _job(tmp_path / "retry", resume_from=str(tmp_path / "last.pt")))
    assert again.start_epoch == 4  # range(trial.start_epoch, n) in the loop's numbering: its 5th epoch is epoch 4
    with pytest.raises(ContractError, match=r"epoch 3 was reported already \(the last was 3\)"):
        again.report(3, {"val_acc": 0.9})


def test_the_result_is_the_epoch_of_the_logged_model(tmp_path):
    trial = Trial(Driver().child, _job(tmp_path))
    net = torch.nn.Linear(3, 2)
    trial.report(1, {"val_acc": 0.9}, checkpoint={"w": torch.ones(1)})
    assert trial.is_best
    trial.report(2, {"val_acc": 0.5}, checkpoint={"w": torch.ones(1) * 2})
    assert not trial.is_best
    trial.log_model(net, torch.zeros(1, 3))  # the final weights: epoch 2's
    s = trial.summary(False, None)
    assert (s["best_epoch"], s["best_value"], s["model_epoch"]) == (2, 0.5, 2)
    assert torch.equal(load_checkpoint(tmp_path / "best.pt")["state"]["w"], torch.ones(1) * 2)  # best.pt: the result's
    assert trial._example.shape == (2, 3)  # a one-row example is kept as two rows (the export keeps the batch dynamic)
    trial.log_model(net, torch.zeros(2, 3), epoch=1)  # weights the loop says are epoch 1's
    assert trial.summary(False, None)["best_epoch"] == 1
    with pytest.raises(ContractError, match="epoch 7 was not reported"):
        trial.log_model(net, torch.zeros(2, 3), epoch=7)

    class OneRow(torch.nn.Module):
        def forward(self, x):
            return x.view(2, -1)  # a batch size written into the model

    with pytest.raises(ContractError, match="the model cannot take a batch of 3 rows"):
        trial.log_model(OneRow(), torch.zeros(2, 3))


def test_objectives_are_the_best_epochs_values_and_costs_need_the_model(tmp_path):
    job = _job(tmp_path)
    job["config"].update(objectives=["val_acc", "val_loss"], cost_metrics=[])
    trial = Trial(Driver().child, job)
    trial.report(1, {"val_acc": 0.5, "val_loss": 2.0})
    trial.report(2, {"val_acc": 0.7, "val_loss": 1.5})
    trial.report(3, {"val_acc": 0.6, "val_loss": 1.0})
    assert trial.summary(False, None)["objectives"] == {"val_acc": 0.7, "val_loss": 1.5}
    job["config"]["cost_metrics"] = ["params"]
    with pytest.raises(TrialFailure, match=r"objectives params are measured on the model: call trial.log_model"):
        trial.summary(False, None)
    trial.log_model(torch.nn.Linear(3, 2), torch.zeros(1, 3))
    assert trial.summary(False, None)["objectives"]["params"] == 8


def test_a_stopped_trial_with_cost_objectives_needs_no_logged_model(tmp_path):
    # Pruned (or interrupted: retried) after its first epoch, the loop returns at once without
    # trial.log_model: its summary must not fail for the cost metric it never had a model to measure.
    job = _job(tmp_path)
    job["config"].update(objectives=["val_acc", "params"], cost_metrics=["params"])
    trial = Trial(Driver(stop_at=1).child, job)
    assert trial.report(1, {"val_acc": 0.4}) is True
    summary = trial.summary(False, None)
    assert summary["stop_reason"] == "stopped_by_caller" and summary["objectives"] == {"val_acc": 0.4}

    finished = Trial(Driver().child, _job(tmp_path / "done"))
    finished.config.update(objectives=["val_acc", "params"], cost_metrics=["params"])
    finished.report(1, {"val_acc": 0.4})
    with pytest.raises(TrialFailure, match="call trial.log_model"):  # one that ran to the end still must log it
        finished.summary(False, None)


def test_a_loop_that_returns_before_max_epochs_says_so(tmp_path):
    trial = Trial(Driver().child, _job(tmp_path))  # trainer.max_epochs: 5
    trial.report(1, {"val_acc": 0.4})
    trial.report(2, {"val_acc": 0.5})
    assert trial.summary(False, None)["stop_reason"] == "returned"  # its own early stopping, not "max_epochs"


def test_optuna_trial_pruned_raised_by_the_loop_ends_it_as_pruned_by_train(tmp_path):
    import types

    import optuna

    from hpolab.study.trials.trial import run_trial
    from hpolab.study.trials.trial_process import report

    def train(config, trial):
        trial.report(1, {"val_acc": 0.3})
        raise optuna.TrialPruned()  # the loop's own pruning, as with optuna's objective functions

    driver_end, child_end = multiprocessing.Pipe()
    messages = []

    def serve():
        while True:
            try:
                msg = driver_end.recv()
            except EOFError:
                return
            messages.append(msg)
            if msg[0] == "epoch":
                driver_end.send("continue")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    driver_end.send("go")  # the segment's start is recorded: an own loop is called after it
    run_trial(child_end, _job(tmp_path), report, offer_export=None, experiment=types.SimpleNamespace(train=train))
    thread.join(timeout=10)
    done = [m for m in messages if m[0] == "done"]
    assert done and done[0][1]["pruned_by_train"] is True and done[0][1]["stop_reason"] == "stopped_by_caller"
