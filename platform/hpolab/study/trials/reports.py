"""A trial's epoch reports to the driver: each after its checkpoint is on disk, in order.

`trial.report(epoch, metrics, checkpoint=state)` checks the metrics and serializes the checkpoint in
the loop's own thread (the loop changes those tensors next); writing the checkpoint, sending the
epoch and reading the driver's "continue" | "stop" is a Report's, in one of two ways:

- waiting (the study may prune): done before report returns, so a pruned trial stops right after
  the epoch its pruner judged and trains nothing more.
- pipelined (the study has no pruner and no trial scheduler: only the driver's own stop, a graceful
  Ctrl-C or SIGTERM, can end a trial early): done on a thread while the loop trains its next epoch;
  the next report waits for it first. The checkpoint's fsync and the round trip to the driver (its
  turn on a shared CPU) then cost the loop nothing. A stop is seen by the next report, which returns
  True without sending its epoch: that epoch is trained but neither reported nor checkpointed, so the
  trial's records end after the epoch the driver answered "stop" to, as in waiting mode. A loop that
  does not poll `trial.stop_requested()` is interrupted in its epoch instead (stop_interrupt.py).

Either way the epoch's message goes out only after its checkpoint is renamed into place (the driver
stages that file for upload before it answers) and the next checkpoint is written only after that
answer: what the driver stages is exactly that epoch.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

from hpolab.study.trials.lifeline import ORPHAN_EXIT_CODE


class Reports:
    """The epoch messages of one trial process (its pipe to the driver is used by nobody else meanwhile)."""

    def __init__(self, conn, pipelined: bool, on_stop: Callable[[], None] | None = None):
        self._conn = conn
        self.pipelined = pipelined
        self._on_stop = on_stop  # a pipelined "stop" interrupts the loop's epoch in progress (stop_interrupt.py)
        self.stopped = False  # the driver answered "stop"
        self._job: threading.Thread | None = None
        self._error: BaseException | None = None  # the checkpoint's write failed (disk full ...)

    def send(self, epoch: int, values: dict[str, float], write: Callable[[], None] | None) -> None:
        """Write the checkpoint (`write`, when given), send the epoch, read the answer: now (waiting
        mode) or on a thread (pipelined). Call settle() first: one report at a time."""
        if not self.pipelined:
            self._report(epoch, values, write)
            self._raise()
            return
        self._job = threading.Thread(target=self._report, args=(epoch, values, write), name="trial-report", daemon=True)
        self._job.start()

    def settle(self, raise_error: bool = True) -> None:
        """Wait for the report in flight (its write, message and answer); raise its write's error."""
        if self._job is not None:
            self._job.join()
            self._job = None
        if raise_error:
            self._raise()
        else:
            self._error = None

    def _report(self, epoch: int, values: dict[str, float], write: Callable[[], None] | None) -> None:
        if write is not None:
            try:
                write()
            except BaseException as e:  # noqa: BLE001 -- the loop's thread raises it (settle): the trial fails
                self._error = e
                return
        try:
            self._conn.send(("epoch", epoch, values))
            self.stopped = self._conn.recv() == "stop"
            if self.stopped and self.pipelined and self._on_stop is not None:
                self._on_stop()
        except (EOFError, OSError):  # the driver is gone (its end closed): nobody to train for
            os._exit(ORPHAN_EXIT_CODE)

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
