"""The driver's background writer: checkpoint uploads, model logging, run closes and retention.

Nothing that can take seconds runs on the driver's loop (it answers every trial's epoch): one thread
takes jobs from a bounded FIFO queue. One thread and FIFO order, so a run's uploads, its model and
its close happen in the order they were queued (a run is never closed before its checkpoint lands).

Checkpoints are staged first: at the epoch message (before the driver replies, so the child cannot
have written the next epoch yet) last.pt, and best.pt when it changed, are hard-linked into a staging
folder (O(1), no copy); the child's atomic rename of the next last.pt leaves the staged inode intact,
so the upload is exactly that epoch's state however late the thread gets to it.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

from hpolab.study.outage import passthrough

# Jobs waiting at most. When full, submit() waits (the driver's loop blocks) rather than queueing
# more: each job holds a staged checkpoint on disk and the model info in memory, so an unbounded
# queue would let a slow artifact store fall arbitrarily behind (and a killed driver lose it all);
# waiting is backpressure that keeps the lag to a few uploads.
MAX_QUEUED = 4


class Uploader:
    def __init__(self, note: Callable[[str], None], guard: Callable[..., Any] | None = None):
        self.note = note
        # Each job runs through `guard` (outage.py): while the tracking store's database is briefly
        # unreachable a job is retried, so a run's close is not lost to a restart.
        self.guard = guard or passthrough
        self._queue: queue.Queue = queue.Queue(maxsize=MAX_QUEUED)
        self._thread: threading.Thread | None = None
        self.waited_s = 0.0  # time the driver spent waiting for a free slot (for bench attribution)

    def submit(self, label: str, fn: Callable[..., Any], *args: Any) -> None:
        if self._thread is None:
            # daemon: a driver that dies of an error still exits; close() is what flushes the queue
            self._thread = threading.Thread(target=self._work, name="uploader", daemon=True)
            self._thread.start()
        t0 = time.monotonic()
        self._queue.put((label, fn, args))
        self.waited_s += time.monotonic() - t0

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                label, fn, args = item
                try:
                    self.guard(fn, *args)
                except Exception as e:  # a failed upload must not stop the ones behind it
                    self.note(f"{label} failed: {type(e).__name__}: {e}")
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every queued job is done."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        """Finish every queued job, then stop the thread (the driver's exit: normal, Ctrl-C, error)."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._thread = None


def upload_due(last_upload: float, every: float | None, now: float) -> bool:
    """A running trial's periodic upload: at most every `every` seconds (None: never)."""
    return every is not None and now - last_upload >= every


def stage_checkpoints(trial_dir: Path, epoch: int, best_inode: int | None) -> tuple[Path | None, int | None]:
    """Hard-link last.pt (and best.pt if its inode changed since `best_inode`) into a staging folder.

    Returns (folder or None when there is no last.pt, best.pt's inode now)."""
    last = trial_dir / "last.pt"
    if not last.is_file():
        return None, best_inode
    folder = trial_dir / f".upload-{epoch}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    _link(last, folder / "last.pt")
    best = trial_dir / "best.pt"
    inode = best.stat().st_ino if best.is_file() else None
    if inode is not None and inode != best_inode:
        _link(best, folder / "best.pt")
    return folder, inode


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links: a copy (slower, still consistent)
        shutil.copy2(src, dst)
