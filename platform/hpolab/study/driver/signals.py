"""Ctrl-C and SIGTERM for a driver: the first stops gracefully, the second stops now.

First SIGINT or SIGTERM (`docker stop`, Kubernetes eviction, SLURM preemption): start no new
trials; running trials checkpoint, stop after their current epoch and are queued to resume.
A second one (either): kill the trials now (still resumable from their last checkpoint).
The CLI exits 130 after SIGINT and 143 after SIGTERM.
"""

from __future__ import annotations

import signal
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
