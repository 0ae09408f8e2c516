"""Imported only as the forkserver's last preload (trial_forkserver.py): the forkserver ends at once when its
driver is gone, instead of tearing down an interpreter that holds torch (and MLflow): a second or two
of CPU for nothing, taken from the next study or test on a small machine.

The forkserver leaves its loop by raising SystemExit when the driver closes its alive pipe; this
atexit handler, registered after every other preload's, runs first. Its forked trials never run
atexit handlers (they end with os._exit)."""

import atexit
import os
import sys


def _exit_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


atexit.register(_exit_now)
