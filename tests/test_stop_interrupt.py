"""A driver's "stop" interrupts an own loop's epoch in its own code, never inside the trial object.

(The whole path through a driver stopped by SIGTERM: tests/test_one_path.py, own_loop SIGTERM.)"""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time

import pytest

from hpolab.study.trials import stop_interrupt
from hpolab.study.trials.reports import Reports


@pytest.fixture
def interrupt():
    before = signal.getsignal(stop_interrupt.STOP_SIGNAL)
    yield stop_interrupt.interrupter()
    signal.signal(stop_interrupt.STOP_SIGNAL, before)


def test_a_stop_ends_the_epoch_in_progress_and_the_loops_finally_runs(interrupt):
    seen = []

    def train(config, trial):
        try:
            threading.Timer(0.2, interrupt).start()
            for _ in range(200):  # a 10 s epoch of short calls into C
                time.sleep(0.05)
            seen.append("epoch trained to its end")
        finally:
            seen.append("finally")

    started = time.monotonic()
    stop_interrupt.run(train, {}, None)
    assert seen == ["finally"] and time.monotonic() - started < 5


def test_a_stop_that_comes_while_the_loop_is_in_the_trial_object_lets_that_call_finish(interrupt):
    """The report's own thread receives "stop" while the loop waits for that report (settle): the
    wait ends normally, the stop is seen there (stopped), and the loop goes on to its next report."""
    loop_end, driver_end = multiprocessing.Pipe()
    reports = Reports(loop_end, pipelined=True, on_stop=interrupt)
    seen = []

    def driver():
        assert driver_end.recv() == ("epoch", 1, {"val_acc": 0.5})
        time.sleep(0.3)  # the loop is in settle() by now
        driver_end.send("stop")

    def train(config, trial):
        reports.send(1, {"val_acc": 0.5}, None)
        reports.settle()
        seen.append(reports.stopped)
        time.sleep(0.2)  # (the loop's own code: a signal still pending would be raised here)
        seen.append("after")

    answering = threading.Thread(target=driver)
    answering.start()
    stop_interrupt.run(train, {}, None)
    answering.join()
    assert seen == [True, "after"]


def test_no_stop_is_raised_after_train_returned(interrupt):
    stop_interrupt.run(lambda config, trial: None, {}, None)
    interrupt()  # (the handler runs in this frame, outside run's call of train)
    time.sleep(0.05)
