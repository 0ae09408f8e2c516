"""A trial's output: what its process, and the processes it starts, print, kept per trial.

The trial process points its stdout and stderr (file descriptors 1 and 2: print, logging, warnings,
native libraries, DataLoader workers, DDP ranks) at a pipe whose other end the driver reads on its
loop, next to the trial's messages. The driver

- appends it to `output.log` in the trial's folder, at most LOG_LIMIT bytes a file: a full
  output.log becomes output.1.log (the one before is dropped), so a trial keeps two files at most;
- prints each line on its console as `trial N | line` (unless `study run --hide-trial-output`); a
  line drawn over and over with carriage returns (a progress bar) is printed once, as it ends;
- keeps the last lines: a failed trial's failure line, its run (`hpolab.output_tail`) and `study
  status` show them.

The run gets output.log (and output.1.log) as artifacts when it closes (tracker.py). Reading stays
with the driver, so nothing a trial printed is lost when it crashes: the bytes wait in the pipe.
"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path
from typing import Callable

LOG_NAME, OLD_LOG_NAME = "output.log", "output.1.log"
LOG_LIMIT = 5 * 2**20  # bytes per file: output.log, then output.1.log
TAIL_LINES = 5  # the last lines a failure shows
TAIL_CHARS = 300  # of each
READ_SIZE = 1 << 16
FAILURE_ATTR = "hpolab.failure"  # Optuna system attr of a failed trial: {"reason", "output"} (`study status`)


def capture(conn) -> None:
    """In the trial process, first: fds 1 and 2 into the output pipe `conn` (its write end), line
    buffered, so each line reaches the driver as it is printed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    os.dup2(conn.fileno(), 1)
    os.dup2(conn.fileno(), 2)
    conn.close()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except (AttributeError, ValueError):
            pass


class TrialOutput:
    """The driver's end of one trial process's output pipe."""

    def __init__(self, conn, number: int, folder: Path, show: Callable[[int, str], None] | None):
        self.conn = conn
        self.number = number
        self.path = Path(folder) / LOG_NAME
        self.show = show  # prints a line on the console (None: the log only)
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.closed = False
        self._partial = b""
        os.set_blocking(conn.fileno(), False)

    def read(self) -> None:
        """Take what the pipe holds now; closed once every writer is gone (the process and its children)."""
        while not self.closed:
            try:
                data = os.read(self.conn.fileno(), READ_SIZE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close()
                return
            self._append(data)
            self._lines(data)

    def _append(self, data: bytes) -> None:
        try:
            if self.path.is_file() and self.path.stat().st_size + len(data) > LOG_LIMIT:
                os.replace(self.path, self.path.with_name(OLD_LOG_NAME))
            with open(self.path, "ab") as f:
                f.write(data)
        except OSError:  # (a full disk): the console and the tail still get it
            pass

    def _lines(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        # a line never ended (a progress bar redrawn with \r): only what it shows now is kept
        self._partial = self._partial.rsplit(b"\r", 1)[-1][-READ_SIZE:]
        for raw in lines:
            self._line(raw)

    def _line(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rsplit("\r", 1)[-1].rstrip()  # a redrawn line: what a terminal shows last
        if not line.strip():
            return
        self.tail.append(line[:TAIL_CHARS])
        if self.show is not None:
            self.show(self.number, line)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._partial:
            self._line(self._partial)
            self._partial = b""
        try:
            self.conn.close()
        except OSError:
            pass

    def last_lines(self) -> list[str]:
        """The last lines read so far (what the pipe holds now is read first)."""
        self.read()
        return list(self.tail)


def log_files(folder: Path) -> list[Path]:
    """A trial's output files, oldest first (for its run's artifacts)."""
    return [p for p in (Path(folder) / OLD_LOG_NAME, Path(folder) / LOG_NAME) if p.is_file()]
