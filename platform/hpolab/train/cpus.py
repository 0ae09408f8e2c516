"""How many CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota.

os.cpu_count() is the machine's cores. A Slurm task with --cpus-per-task 4 on a 64-core node is bound
to 4 of them (its affinity mask); a container limited to 4 CPUs sees all 64 but gets a quota of 4
(cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`). Torch threads beyond what the
process may run on only contend: a trial's threads are counted from here.

`root` is the filesystem root the files are read under ("/"; tests pass a folder of fabricated files).
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def cpu_set() -> set[int]:
    """The CPUs in this process's affinity mask (every CPU where the platform has no affinity)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def available_cpus(root: str | Path = "/") -> int:
    """CPUs this process may run on (at least 1): the affinity mask, capped by the cgroup quota
    (rounded down: 1.5 CPUs of quota run 1 thread without throttling)."""
    mask = len(cpu_set())
    quota = cgroup_cpu_limit(root)
    return max(1, mask if quota is None else min(mask, math.floor(quota)))


def cgroup_cpu_limit(root: str | Path = "/") -> float | None:
    """The CPU quota (quota / period, in CPUs) of this process's cgroup or of any of its ancestors, the
    smallest; None when there is none, or nothing can be read."""
    root = Path(root)
    try:
        lines = (root / "proc" / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    mounts = root / "sys" / "fs" / "cgroup"
    limits: list[float | None] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":  # cgroup v2 (unified)
            limits += [_v2_limit(d) for d in _with_ancestors(mounts, path)]
        elif "cpu" in controllers.split(","):  # cgroup v1: mounted as cpu,cpuacct (often also linked as cpu)
            for mount in dict.fromkeys((controllers, "cpu")):
                limits += [_v1_limit(d) for d in _with_ancestors(mounts / mount, path)]
    found = [x for x in limits if x is not None]
    return min(found) if found else None


def _with_ancestors(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder and each parent up to the mount's root (a parent's quota caps its children)."""
    parts = [p for p in path.strip().split("/") if p]
    return [mount.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def _v2_limit(d: Path) -> float | None:
    text = _read(d / "cpu.max")  # "max 100000" (no quota) or "400000 100000" (4 CPUs)
    if not text:
        return None
    quota, _, period = text.partition(" ")
    try:
        return None if quota == "max" else int(quota) / int(period or "100000")
    except (ValueError, ZeroDivisionError):
        return None


def _v1_limit(d: Path) -> float | None:
    quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
    try:
        return None if quota is None or period is None or int(quota) < 0 else int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
