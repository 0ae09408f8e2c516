"""Ctrl-C and SIGTERM for a driver: the first stops gracefully, the second stops now.

First SIGINT or SIGTERM (`docker stop`, Kubernetes eviction, SLURM preemption): start no new
trials; running trials checkpoint, stop after their current epoch and are queued to resume.
A second one (either): kill the trials now (still resumable from their last checkpoint).
The CLI exits 130 after SIGINT and 143 after SIGTERM.
"""

from __future__ import annotations

import signal
import threading
import warnings
from typing import Callable

NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class StopSignals:
    def __init__(self, note: Callable[[str], None]):
        self.note = note
        self.stopping = False  # start nothing new; running trials stop after their epoch
        self.aborting = False  # stop now
        self.signum: int | None = None  # the first signal received
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        """Handle Ctrl-C and SIGTERM until restore(). Python lets only the main thread set handlers: a
        driver run from another thread (a notebook's background thread, a script's worker) runs
        without them, and says so (a warning: shown once, also when progress is off)."""
        if threading.current_thread() is not threading.main_thread():
            warnings.warn("hpolab: the study runs in a thread that is not the main thread: Ctrl-C and SIGTERM do not "
                          "stop it gracefully (Python sets signal handlers in the main thread only)", RuntimeWarning, stacklevel=3)
            return
        for s in NAMES:
            self._previous[s] = signal.signal(s, self._handler)

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    def _handler(self, signum, frame) -> None:
        name = NAMES.get(signum, str(signum))
        if not self.stopping:
            self.stopping, self.signum = True, signum
            self.note(f"{name}: starting no new trials; running trials stop after their current epoch "
                      "and resume on the next run (Ctrl-C or SIGTERM again to stop now)")
        else:
            self.aborting = True
            self.note(f"{name} again: stopping now")
