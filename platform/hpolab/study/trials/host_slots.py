"""The trial slots of every hpolab driver on this host, so that drivers sharing CPUs share them out.

A driver gives each trial its CPUs divided by `parallel` (runner.threads_per_trial). Two workers
started on one machine (two terminals, two `hpolab worker`s under one Slurm allocation without CPU
binding, two studies at once) each counted all the CPUs, so their trials ran twice the threads the
machine has. Torch's OpenMP threads then spin against each other: on the 2-core machine, two workers
with one-epoch trials did 0.8 trials/s, against 4.7 with one thread per trial (bench/team_workers.py).

So each driver keeps a small file here while its loop runs, `<pid>.json` with its CPU set and the
number of trials it runs now (its `parallel` when its loop starts; rewritten when that changes, a fall
once it has lasted 2 s), and a trial's threads are its driver's
CPUs divided by its own `parallel` plus the trials the other live drivers on overlapping CPUs run. A
driver waiting (for another worker's last trials, a rung, a PBT boundary) counts for nothing.
Drivers bound to disjoint CPUs (Slurm's --cpu-bind, taskset, a container's cpuset) do not count each
other; one driver alone gets what it got before. The files live in /dev/shm (memory, per host, gone
at reboot) in a folder per user (elsewhere: the temporary folder, with the host's name, as that may
be shared between hosts). A driver that died leaves its file behind; it is not counted (its pid is
gone, a zombie, or another process now) and is removed by the next reader. Drivers in another pid
namespace (containers sharing /dev/shm) cannot be checked, and are neither counted nor removed.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from pathlib import Path

from hpolab.study.state.owners import pid_namespace, process_start_time, this_host

DIR_ENV = "HPOLAB_HOST_SLOTS_DIR"  # another folder (tests; a host without /dev/shm)
SETTLE_S = 2.0  # a driver running fewer trials says so once that has lasted this long (a driver's loop wakes every second)


def slots_dir() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / f"hpolab-slots-{os.getuid()}"
    return Path(tempfile.gettempdir()) / f"hpolab-slots-{os.getuid()}-{this_host()}"


def _alive(pid: int, started: str | None) -> bool:
    """The driver that wrote an entry runs still: its pid is live and started when the entry says (a
    later process with its pid, a zombie, are not it). An entry written without /proc has no start
    time: a live pid is taken as the driver."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return started is None or process_start_time(pid) == started


def _ours(folder: Path) -> bool:
    """The folder is this user's own and private: another local user's entries would decide our threads."""
    try:
        st = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077 == 0


class HostSlots:
    """This driver's entry while its loop runs (hold / running / release), and the slots sharing its CPUs."""

    def __init__(self, cpus: set[int], parallel: int, folder: Path | None = None):
        self.cpus, self.parallel = set(cpus), parallel
        self.folder = folder or slots_dir()
        self.path = self.folder / f"{os.getpid()}.json"
        self.held = False
        self._running = 0  # the trials the entry says this driver runs
        self._lower_since: float | None = None  # since when it has run fewer than that

    def hold(self) -> None:
        """Write this driver's entry, saying `parallel` trials: its loop starts them at once, and two
        drivers started together must count each other's first trials (each saw the other's entry at
        0 and gave its trials all the CPUs; under a trial scheduler a trial keeps its first segment's
        threads). Once it runs fewer for SETTLE_S, its entry says so. Best effort: a folder that cannot
        be made, or is not this user's own, leaves the driver counting its own slots only, as before."""
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            return
        self.held = _ours(self.folder)
        self._running, self._lower_since = self.parallel, None
        self._write()

    def running(self, n: int) -> None:
        """The number of trials this driver runs now. A rise is written at once; a fall only once it has
        lasted SETTLE_S: between two trials a driver runs none for a moment, and another driver's trial
        starting then would take its threads for its whole length."""
        if not self.held:
            return
        if n >= self._running:
            self._lower_since = None
            if n > self._running:
                self._running = n
                self._write()
            return
        now = time.monotonic()
        if self._lower_since is None:
            self._lower_since = now
        if now - self._lower_since >= SETTLE_S:
            self._running, self._lower_since = n, None
            self._write()

    def _write(self) -> None:
        """Atomically (a reader never sees half of it); a failed write leaves the last one."""
        if not self.held:
            return
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"cpus": sorted(self.cpus), "slots": self._running,
                                       "started": process_start_time(os.getpid()), "pidns": pid_namespace()}))
            os.replace(tmp, self.path)
        except OSError:
            pass

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def sharing(self) -> int:
        """This driver's `parallel` plus the trials the other live drivers on overlapping CPUs run; the
        entries of dead drivers are removed. A driver not holding an entry counts its own only."""
        total = self.parallel
        if not self.held:
            return total
        if not self.path.exists():  # (a reader took it for a dead driver's: pid reuse)
            self._write()
        try:
            entries = list(self.folder.glob("*.json"))
        except OSError:
            return total
        here = pid_namespace()
        for entry in entries:
            if entry == self.path:
                continue
            try:
                pid, data = int(entry.stem), json.loads(entry.read_text())
            except (ValueError, OSError):  # (a name not ours, or gone since the listing)
                continue
            if data.get("pidns") != here:  # another pid namespace: its pid means nothing here
                continue
            if not _alive(pid, data.get("started")):
                entry.unlink(missing_ok=True)
                continue
            if self.cpus & set(data.get("cpus") or []):
                total += int(data.get("slots") or 0)
        return total
