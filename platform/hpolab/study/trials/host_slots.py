"""The trial slots of every hpolab driver on this host, so that drivers sharing CPUs share them out.

A driver gives each trial its CPUs divided by `parallel` (runner.threads_per_trial). Two workers
started on one machine (two terminals, two `hpolab worker`s under one Slurm allocation without CPU
binding, two studies at once) each counted all the CPUs, so their trials ran twice the threads the
machine has. Torch's OpenMP threads then spin against each other: on the 2-core machine, two workers
with one-epoch trials did 0.8 trials/s, against 4.7 with one thread per trial (bench/team_workers.py).

So each driver that runs trials writes a small file here, `<pid>.json` with its CPU set and its
`parallel`, while its loop runs, and a trial's threads are its driver's CPUs divided by the slots of
every live driver whose CPUs overlap them. Drivers bound to disjoint CPUs (Slurm's --cpu-bind, taskset,
a container's cpuset) do not count each other; one driver alone gets what it got before. The files
live in /dev/shm (memory, per host, gone at reboot) in a folder per user; a driver that died leaves its
file behind, and it is not counted (its pid is gone, or is another process now) and removed by the
next reader.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

DIR_ENV = "HPOLAB_HOST_SLOTS_DIR"  # another folder (tests; a host without /dev/shm)


def slots_dir() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        base = Path(tempfile.gettempdir())
    return base / f"hpolab-slots-{os.getuid()}"


def _started(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22): tells a live driver from
    a later process that got its pid. None where there is no /proc (then a live pid is taken as the driver)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None if not Path("/proc/self/stat").exists() else "gone"
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = _started(pid)
    return now != "gone" and (started is None or now is None or now == started)


class HostSlots:
    """This driver's entry while its trials run (hold/release), and the slots sharing its CPUs."""

    def __init__(self, cpus: set[int], parallel: int, folder: Path | None = None):
        self.cpus, self.parallel = set(cpus), parallel
        self.folder = folder or slots_dir()
        self.path = self.folder / f"{os.getpid()}.json"
        self.held = False

    def hold(self) -> None:
        """Write this driver's entry (atomically: a reader never sees half of it). Best effort: a folder
        that cannot be written leaves the driver counting its own slots only, as before."""
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"cpus": sorted(self.cpus), "slots": self.parallel,
                                       "started": _started(os.getpid())}))
            os.replace(tmp, self.path)
            self.held = True
        except OSError:
            pass

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def sharing(self) -> int:
        """Trial slots of the live drivers on CPUs overlapping this one's, its own included (at least
        its `parallel`); the entries of dead drivers are removed."""
        total = self.parallel
        try:
            entries = list(self.folder.glob("*.json"))
        except OSError:
            return total
        for entry in entries:
            if entry == self.path:
                continue
            try:
                pid, data = int(entry.stem), json.loads(entry.read_text())
            except (ValueError, OSError):  # (a name not ours, or gone since the listing)
                continue
            if not _alive(pid, data.get("started")):
                entry.unlink(missing_ok=True)
                continue
            if self.cpus & set(data.get("cpus") or []):
                total += int(data.get("slots") or 1)
        return total
