"""The child's end of the lifeline: a pipe whose other end only the driver holds.

When the driver dies (even by SIGKILL) the OS closes its end, `recv()` sees EOF, and the child
exits at once -- no orphan keeps a CPU or GPU busy.
"""

from __future__ import annotations

import os
import threading

ORPHAN_EXIT_CODE = 70


def _watch(lifeline) -> None:
    try:
        lifeline.recv()  # the driver never sends; this returns only by EOF when the driver is gone
    except (EOFError, OSError):
        pass
    os._exit(ORPHAN_EXIT_CODE)


_watched: set[tuple[int, int]] = set()  # (process id, id of the pipe): threads do not survive a fork, this set does


def watch_lifeline(lifeline) -> None:
    """Watch it on a thread of its own, once per process (a standby's trial watches the same pipe;
    a DDP rank forked from the trial process watches it again)."""
    key = (os.getpid(), id(lifeline))
    if key in _watched:
        return
    _watched.add(key)
    threading.Thread(target=_watch, args=(lifeline,), name="lifeline", daemon=True).start()
