"""Who runs a trial: the driver process that owns it, recorded on the Optuna trial.

Each RUNNING trial carries the user attr `hpolab.owner` = {host, boot_id, pid_ns, pid, start_time, trial}:
the driver's host name, the kernel's boot id, its pid and the process start time (field 22 of
/proc/<pid>/stat, so a recycled pid is not mistaken for the owner). A driver on the same host can
then tell at once that an owner is gone, instead of waiting for its heartbeats to go stale.
`trial` is the trial number the record was written for: a retry copy that inherited its dead
original's attrs is not mistaken for owned.

`pid_ns` is the driver's PID namespace (the link /proc/self/ns/pid, e.g. "pid:[4026531836]"; None
where there is none to read). Containers that share the host's name but not its PIDs (Kubernetes
`hostNetwork`, `docker run --network host`) each number their processes from 1: a pid is only checked
inside its own namespace; an owner in another one (or in an unknown one) is judged by its heartbeats,
like an owner on another host. A record without `pid_ns` (written before it was recorded) is checked
by pid, as it was then.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from typing import Any

OWNER_ATTR = "hpolab.owner"


def this_host() -> str:
    """This machine's name as owner records give it. HPOLAB_TEST_HOSTNAME overrides it for tests
    only: a worker that must look as if it ran on another host (tests/test_proxy_heartbeat.py)."""
    return os.environ.get("HPOLAB_TEST_HOSTNAME") or socket.gethostname()


def _boot_id() -> str:
    try:
        return open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        return ""


def pid_namespace() -> str | None:
    """This process's PID namespace, e.g. "pid:[4026531836]" (None where /proc/self/ns is absent)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_start_time(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot), or None if it is gone or a zombie."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "(comm) ": field 3 (state) onwards
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]  # field 22: starttime


def owner_record(trial_number: int) -> dict[str, Any]:
    """This driver, as the owner of trial `trial_number`."""
    pid = os.getpid()
    return {"host": this_host(), "boot_id": _boot_id(), "pid_ns": pid_namespace(), "pid": pid,
            "start_time": process_start_time(pid), "trial": trial_number}


def owner_of(trial) -> dict[str, Any] | None:
    """The trial's own owner record (None when it has none, or only an inherited one)."""
    rec = trial.user_attrs.get(OWNER_ATTR)
    if not isinstance(rec, dict) or rec.get("trial") != trial.number:
        return None
    return rec


def owner_gone(rec: dict[str, Any] | None) -> str | None:
    """Why the owner is certainly gone (same host, same PID namespace only), or None when it may be alive."""
    if rec is None or rec.get("host") != this_host():
        return None  # another host: only its heartbeats can tell
    where = f"its driver (pid {rec.get('pid')} on {rec.get('host')})"
    if rec.get("boot_id") and _boot_id() and rec["boot_id"] != _boot_id():
        return f"{where} ran before this machine rebooted"
    if "pid_ns" in rec and (rec["pid_ns"] is None or rec["pid_ns"] != pid_namespace()):
        return None  # its pid numbers another container's processes (or an unknown one's): only its heartbeats can tell
    if process_start_time(int(rec["pid"])) != rec.get("start_time"):
        return f"{where} is gone"
    return None


def describe(rec: dict[str, Any] | None) -> str:
    return f"{rec.get('host')} pid {rec.get('pid')}" if rec else "an unknown driver"


def heartbeat_age(storage, trial_id: int) -> float | None:
    """Seconds since the trial's last heartbeat (None: none recorded, or the store cannot say)."""
    try:
        import sqlalchemy
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        with _create_scoped_session(storage.scoped_session) as session:
            hb = models.TrialHeartbeatModel.where_trial_id(trial_id, session)
            if hb is None:
                return None
            now = session.execute(sqlalchemy.func.now()).scalar()
            return (now.replace(tzinfo=None) - hb.heartbeat.replace(tzinfo=None)).total_seconds()
    except Exception:
        return None


def age_since_start(trial) -> float:
    start = trial.datetime_start
    return (dt.datetime.now() - start).total_seconds() if start else 0.0


HEARTBEAT_ATTR = "hpolab.heartbeat"  # system attr: the writer's time.time() at its last beat (proxy stores: driver/heartbeat.py)


def first_heartbeat(storage, trial_id: int, guard=lambda f, *a, **k: f(*a, **k)) -> None:
    """A claimed trial's first heartbeat: Optuna's where the storage has them, else the proxy's attr."""
    import time

    if hasattr(storage, "record_heartbeat"):
        guard(storage.record_heartbeat, trial_id)
    else:  # the gRPC proxy: the first hpolab heartbeat attr (driver/heartbeat.py watches it change)
        guard(storage.set_trial_system_attr, trial_id, HEARTBEAT_ATTR, time.time())


def why_dead(t, stale_ids: set[int], storage) -> tuple[str, str] | None:
    """(kind, reason) when running or claimed trial `t` of another driver is dead, else None (it may be
    alive). A paused trial (a trial scheduler's) has no process and no heartbeat: never dead."""
    from hpolab.stores.optuna_storage import GRACE_PERIOD
    from hpolab.stores.trial_states import is_paused

    if is_paused(t):
        return None
    owner = owner_of(t)
    gone = owner_gone(owner)
    if gone:
        return "owner_gone", gone
    if t._trial_id in stale_ids:
        return "stale", f"its driver ({describe(owner)}) stopped sending heartbeats for {GRACE_PERIOD} s (killed or lost)"
    # Optuna never calls a trial without any heartbeat stale: a driver killed between ask() and
    # its first beat would leave it RUNNING forever.
    if owner is None and age_since_start(t) > GRACE_PERIOD and heartbeat_age(storage, t._trial_id) is None:
        return "stale", f"its driver never recorded an owner or a heartbeat in {GRACE_PERIOD} s (killed while starting it)"
    return None
