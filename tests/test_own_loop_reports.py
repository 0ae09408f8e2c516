"""An own loop's reports when the study cannot stop a trial early (no pruner): they do not wait for the
driver's answer, each epoch's checkpoint is on disk before its message, and a stop is seen one report
later. A real pipe with the driver's end played by a thread that answers only when let; real files."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest
import torch

from hpolab.config.spec import load_spec
from hpolab.study.trials.trial import Trial
from hpolab.study.trials.runner import cannot_stop_early
from hpolab.train.checkpoint import load_checkpoint

from conftest import ROOT

SPEC = ROOT / "studies" / "digits_own_loop.yaml"


def _job(folder, pipelined: bool = True) -> dict:
    return {"config": {"metric": "val_acc", "direction": "maximize", "seed": 0, "trainer": {"device": "cpu", "max_epochs": 5}},
            "checkpoint_dir": str(folder), "resume_from": None, "number": 3, "params": {}, "pipelined_reports": pipelined}


class GatedDriver:
    """The driver's end of the pipe: records each epoch with the epoch of last.pt on disk when its
    message came, then answers ("stop" from `stop_at` on) once the test lets it (`let`)."""

    def __init__(self, folder, stop_at: int | None = None):
        self.conn, self.child = multiprocessing.Pipe()
        self.folder, self.stop_at = folder, stop_at
        self.seen: list[tuple[int, int | None]] = []  # (epoch of the message, epoch of last.pt then)
        self.gates: dict[int, threading.Event] = {}
        threading.Thread(target=self._serve, daemon=True).start()

    def gate(self, epoch: int) -> threading.Event:
        return self.gates.setdefault(epoch, threading.Event())

    def let(self, epoch: int) -> None:
        self.gate(epoch).set()

    def _serve(self) -> None:
        while True:
            try:
                _, epoch, _ = self.conn.recv()
            except EOFError:
                return
            last = self.folder / "last.pt"
            self.seen.append((epoch, load_checkpoint(last)["epoch"] if last.exists() else None))
            self.gate(epoch).wait(30)
            self.conn.send("stop" if self.stop_at is not None and epoch >= self.stop_at else "continue")


def _report_returns(trial, epoch: int, value: float, timeout: float = 10.0, out: list | None = None):
    """trial.report(...) in a thread: (returned in time?, its result); `out` gets the thread and result."""
    out = [] if out is None else out
    t = threading.Thread(target=lambda: out.append(trial.report(epoch, {"val_acc": value}, checkpoint={"w": torch.ones(1) * epoch})),
                         daemon=True)
    out.append(t)
    t.start()
    t.join(timeout)
    return (not t.is_alive()), (out[1] if len(out) > 1 else None)


def test_without_a_pruner_a_report_returns_before_the_answer_and_the_next_one_waits_for_it(tmp_path):
    driver = GatedDriver(tmp_path)
    trial = Trial(driver.child, _job(tmp_path))
    assert _report_returns(trial, 1, 0.5, timeout=5) == (True, False)  # the driver has not answered epoch 1
    second: list = []
    returned, _ = _report_returns(trial, 2, 0.6, timeout=1, out=second)
    assert not returned  # epoch 2 waits for epoch 1's answer: one report in flight at a time
    for epoch in (1, 2, 3):
        driver.let(epoch)
    second[0].join(10)
    assert second[1:] == [False]
    assert _report_returns(trial, 3, 0.4) == (True, False)
    trial.settle()
    # Each message went out after its own checkpoint was in place, never a later one's
    assert driver.seen == [(1, 1), (2, 2), (3, 3)]
    s = trial.summary(False, None)
    assert (s["epochs_run"], s["best_epoch"], s["stop_reason"]) == (3, 2, "returned")


def test_a_stop_is_seen_by_the_next_report_which_sends_and_records_nothing(tmp_path):
    driver = GatedDriver(tmp_path, stop_at=2)
    trial = Trial(driver.child, _job(tmp_path))
    driver.let(1)
    assert _report_returns(trial, 1, 0.5) == (True, False)
    assert _report_returns(trial, 2, 0.6) == (True, False)  # its answer ("stop") is not in yet
    driver.let(2)
    assert _report_returns(trial, 3, 0.9) == (True, True)  # epoch 3 was trained, then dropped
    assert trial.report(4, {"val_acc": 1.0}) is True
    trial.settle()
    assert [e for e, _ in driver.seen] == [1, 2]
    s = trial.summary(False, None)
    assert (s["epochs_run"], s["best_epoch"], s["stop_reason"]) == (2, 2, "stopped_by_caller")
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 2  # what a retry resumes from: the epoch it was told to stop after


@pytest.mark.parametrize("pipelined", [True, False])
def test_best_pt_is_the_best_epochs_last_pt_kept_under_a_second_name(tmp_path, pipelined):
    driver = GatedDriver(tmp_path)
    for e in (1, 2, 3):
        driver.let(e)
    trial = Trial(driver.child, _job(tmp_path, pipelined))
    trial.report(1, {"val_acc": 0.5}, checkpoint={"w": torch.ones(1)})
    trial.report(2, {"val_acc": 0.8}, checkpoint={"w": torch.ones(1) * 2})
    trial.settle()
    assert os.path.samefile(tmp_path / "best.pt", tmp_path / "last.pt")  # one write (and fsync) for both
    trial.report(3, {"val_acc": 0.7}, checkpoint={"w": torch.ones(1) * 3})
    trial.settle()
    best, last = load_checkpoint(tmp_path / "best.pt"), load_checkpoint(tmp_path / "last.pt")
    assert (best["epoch"], last["epoch"]) == (2, 3) and torch.equal(best["state"]["w"], torch.ones(1) * 2)
    assert trial.summary(False, None)["best_checkpoint"] == str(tmp_path / "best.pt")


def test_a_checkpoint_that_cannot_be_written_fails_the_trial_and_its_epoch_is_not_sent(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    driver = GatedDriver(tmp_path)
    driver.let(1)
    trial = Trial(driver.child, _job(blocker / "trial"))
    trial.report(1, {"val_acc": 0.5}, checkpoint={"w": torch.ones(1)})  # written on the report's thread
    with pytest.raises(OSError):
        trial.settle()
    assert driver.seen == []


def test_only_a_study_without_pruner_or_trial_scheduler_pipelines_its_reports():
    assert cannot_stop_early(load_spec(SPEC, ["pruner={type: none}"])) is True
    assert cannot_stop_early(load_spec(SPEC, [])) is False  # the spec's median pruner: each report waits for its answer
