"""The driver's background writer: a trial run's config.yaml and code file, its batched epoch metrics
(metric_batches.py), checkpoint uploads, model logging, run closes and retention.

Nothing that can take seconds runs on the driver's loop (it answers every trial's epoch): one thread
takes jobs from a FIFO queue. One thread and FIFO order, so a run's uploads, its model and its close
happen in the order they were queued (a run is never closed before its checkpoint lands), and the
driver stays the only writer to the stores (one writer at a time: SQLite stays safe).

Nothing waits on that thread either: a job that needs something not there yet (the model a trial
process is still saving, child_export.py) is queued by `after`, whose own thread waits for it and
then queues the job. The upload thread meanwhile serves every other trial's uploads, and `submit`
never blocks the driver's loop.

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
from pathlib import Path
from typing import Any, Callable

from hpolab.study.state.outage import passthrough

# The queue is unbounded: a full queue would make submit() block the driver's loop, and with it
# every running trial's epochs (a trial waits for its reply). A slow artifact store therefore falls
# behind instead; the driver says so once the backlog passes BACKLOG_NOTE jobs (each holds a staged
# checkpoint on disk, hard links, so the cost is the store's lag, not disk or memory).
BACKLOG_NOTE = 50


class Uploader:
    def __init__(self, note: Callable[[str], None], guard: Callable[..., Any] | None = None):
        self.note = note
        # Each job runs through `guard` (outage.py): while the tracking store's database is briefly
        # unreachable a job is retried, so a run's close is not lost to a restart.
        self.guard = guard or passthrough
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()  # submit() is called from `after`'s threads too: one upload thread
        self._waiters: list[threading.Thread] = []  # `after`'s threads (the driver's loop only appends)
        self._backlog_said = False

    def submit(self, label: str, fn: Callable[..., Any], *args: Any) -> None:
        """Queue a job; returns at once."""
        with self._start_lock:
            if self._thread is None:
                # daemon: a driver that dies of an error still exits; close() is what flushes the queue
                self._thread = threading.Thread(target=self._work, name="uploader", daemon=True)
                self._thread.start()
        self._queue.put((label, fn, args))
        backlog = self._queue.qsize()
        if backlog >= BACKLOG_NOTE and not self._backlog_said:
            self._backlog_said = True
            self.note(f"uploads: {backlog} jobs waiting for the tracking store (it is slower than the trials)")
        elif backlog < BACKLOG_NOTE // 2:
            self._backlog_said = False

    def after(self, label: str, wait: Callable[[], Any], fn: Callable[..., Any], *args: Any) -> None:
        """Queue `fn(*args, wait())` once `wait()` returns, waiting on a thread of its own; returns at once.
        The job keeps FIFO order from when it is queued: whatever was queued before `after` runs first."""
        def wait_then_submit() -> None:
            try:
                value = wait()
            except Exception as e:  # the job still runs (e.g. a run's close), without what it waited for
                self.note(f"{label}: waiting failed: {type(e).__name__}: {e}")
                value = None
            self.submit(label, fn, *args, value)

        self._waiters = [t for t in self._waiters if t.is_alive()]
        t = threading.Thread(target=wait_then_submit, name=f"waiting: {label}", daemon=True)
        self._waiters.append(t)
        t.start()

    def settle(self) -> None:
        """Wait until every `after` has queued its job."""
        for t in list(self._waiters):
            t.join()
        self._waiters = []

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

    def close(self) -> None:
        """Finish every queued job (and every `after`'s), then stop the thread (the driver's exit:
        normal, Ctrl-C, error)."""
        self.settle()
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._thread = None


def upload_due(last_upload: float, every: float | None, now: float) -> bool:
    """A running trial's periodic upload: at most every `every` seconds (None: never)."""
    return every is not None and now - last_upload >= every


def stage_checkpoints(trial_dir: Path, epoch: int, best_id: tuple | None) -> tuple[Path | None, tuple | None]:
    """Hard-link last.pt (and best.pt if it is another file than `best_id`) into a staging folder.

    Returns (folder or None when there is no last.pt, best.pt's identity now). A file's identity is its
    inode number with its modification time: the number alone is not enough, as ext4 gives a freed
    inode's number to the next new file at once, so a new best.pt written after the last upload's
    staging folder was removed often got the uploaded one's number and was not uploaded again."""
    last = trial_dir / "last.pt"
    if not last.is_file():
        return None, best_id
    folder = trial_dir / f".upload-{epoch}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    _link(last, folder / "last.pt")
    best = trial_dir / "best.pt"
    try:
        st = best.stat()
        now = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    except FileNotFoundError:
        now = None
    if now is not None and now != best_id:
        _link(best, folder / "best.pt")
    return folder, now


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links: a copy (slower, still consistent)
        shutil.copy2(src, dst)
