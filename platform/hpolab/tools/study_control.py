"""`hpolab study pause | resume | stop [--now] | set NAME key=value ...`: steer a running study.

Each command writes the next version of the study's control record into its Optuna storage
(stores/control.py) and returns: every live driver of the study applies it within seconds
(study/driver/control.py) and says so; `study status NAME` shows the state and which drivers
applied it. `set` takes the run controls (config/run_controls.py), checked as overrides are.
The study's notification targets get a `control_changed` event (study/driver/notify.py).
"""

from __future__ import annotations

import getpass
import os

from hpolab.config.run_controls import check_controls
from hpolab.errors import EXIT_OK, UserError
from hpolab.stores.control import Control, change_control
from hpolab.stores.paths import Stores
from hpolab.study.state.owners import this_host

STATES = {"pause": "paused", "resume": "running", "stop": "stopped", "set": None}
WHAT = {
    "paused": "no new trials or resumes; running trials go on",
    "running": "trials start again (a stopped study: start its workers again)",
    "stopped": "no new trials; running trials finish, then every worker exits 0",
}


def change_study(name: str, stores: Stores, kind: str, items: list[str] | None = None, now: bool = False) -> Control:
    """Write `kind` (pause | resume | stop | set) as the study's next control version; the record written.
    UserError for a study that is not there, SpecError for a run control that is not valid."""
    from hpolab.stores.optuna_storage import open_storage

    storage = open_storage(stores.optuna_url)
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        names = sorted(s.study_name for s in storage.get_all_studies())
        raise UserError(f"no study named {name!r} in {stores.optuna_shown} (studies there: {', '.join(names) or 'none'})") from None
    values = None
    if kind == "set":
        values = check_controls(list(items or []), storage.get_study_user_attrs(study_id).get("hpolab.spec"), name)
    change = "stop --now" if now else "set " + " ".join(items or []) if kind == "set" else kind
    by = f"{_user()}@{this_host()} pid {os.getpid()}"
    control = change_control(storage, name, change, by, STATES[kind], "now" if now else "drain", values)
    _notify(name, stores, storage, study_id, control)
    return control


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # (a container's uid without a passwd entry)
        return f"uid{os.getuid()}"


def _notify(name: str, stores: Stores, storage, study_id: int, control: Control) -> None:
    """The study's notification targets (as its drivers recorded them) get `control_changed`."""
    from hpolab.study.driver.notify import send_once

    send_once(name, stores, storage.get_study_user_attrs(study_id), "control_changed", {
        "control": {"version": control.version, "state": control.state, "stop": control.stop, "values": control.values,
                    "change": control.change, "by": control.by, "at": control.at}})


def describe_change(name: str, control: Control) -> str:
    if control.change.startswith("set"):
        shown = ", ".join(f"{k}={v}" for k, v in control.values.items())
        what = f"run controls now {shown}"
    elif control.change == "stop --now":
        what = "running trials stop after their current epoch (resumable after `study resume`), then every worker exits 0"
    else:
        what = WHAT[control.state]
    return (f"study {name}: {control.change} (control v{control.version}): {what}. Every live worker applies it within "
            f"seconds; `hpolab study status {name}` shows which did")


def control_cmd(args, stores: Stores) -> int:
    kind = args.study_command
    control = change_study(args.name, stores, kind, getattr(args, "overrides", None), getattr(args, "now", False))
    print(describe_change(args.name, control))
    return EXIT_OK
