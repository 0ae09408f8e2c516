"""The forkserver every trial process is forked from: what it preloads, how it starts, and its start
before the spec is checked.

It imports torch, the routine and the experiment once (and, when the study logs models, MLflow with
torch.export warmed up); every trial is a fork of that warm process. Importing all that takes
seconds, so `study run` starts it first, from a quick read of the spec file (`start_early`), and
checks the spec meanwhile: the spec check imports the experiment too, in the driver, and the driver
then imports MLflow and opens the stores. This module imports neither optuna nor pydantic, so that
read costs milliseconds.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

EXPERIMENT_ENV = "HPOLAB_FORKSERVER_EXPERIMENT"  # read (and removed) by experiment_preload.py in the forkserver
# (experiment module, export warm-up) of the forkserver this process started; None before any start
_started: tuple[str, bool] | None = None


def preload(export_models: bool) -> list[str]:
    """What the forkserver imports before it forks anything (the experiment through experiment_preload.py,
    which reads its name from the environment: see start)."""
    modules = ["hpolab.study.trial_process", "hpolab.study.experiment_preload"]
    if export_models:  # MLflow imported and torch.export warm in every trial (child_export.py)
        modules.append("hpolab.study.export_warm")
    modules.append("hpolab.study.forkserver_exit")  # last: its atexit handler runs first
    return modules


def start(experiment_module: str, export_models: bool):
    """The forkserver context, its server running (a no-op when it already runs with that preload;
    one started with another preload is stopped first). Returns the multiprocessing context.

    It starts with Ctrl-C and SIGTERM ignored (an ignored signal stays ignored across exec): a signal
    to the whole process group (a terminal, `docker stop`, Slurm's scancel signals every process of
    the job) would otherwise kill it, and a killed forkserver makes its live trials read as exited
    with code 255 instead of stopping gracefully with their driver. It still ends with the driver
    (its alive pipe closes) and on SIGKILL."""
    import multiprocessing as mp
    from multiprocessing import forkserver

    global _started
    if _started is not None and _started != (experiment_module, export_models):
        stop_now()
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(preload(export_models))
    os.environ[EXPERIMENT_ENV] = experiment_module  # the forkserver inherits the environment at its start
    try:
        if threading.current_thread() is threading.main_thread():
            previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                forkserver.ensure_running()
            finally:
                for s, h in previous.items():
                    signal.signal(s, h)
        else:  # signal handlers can only be set from the main thread (a driver run in a thread, in tests)
            forkserver.ensure_running()
    finally:
        os.environ.pop(EXPERIMENT_ENV, None)
    _started = (experiment_module, export_models)
    return ctx


def stop_now() -> None:
    """End the forkserver this process started, at once: one started early for a spec that then
    failed its checks would otherwise finish importing torch first (seconds, holding the caller's
    stdout open). It ignores SIGTERM (see start), so it is killed; multiprocessing then forgets it."""
    from multiprocessing import forkserver

    global _started
    server = forkserver._forkserver  # multiprocessing keeps one per process; no public stop
    if server._forkserver_pid is not None:
        try:
            os.kill(server._forkserver_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server._stop()
    _started = None


def start_early(spec_path: str, overrides: list[str]) -> bool:
    """Start the forkserver for the spec file before the spec is checked, when a quick read finds its
    experiment as a file in a project's experiments/ folder (where load_experiment will import it
    from). Returns whether it started; anything unusual (an unreadable spec, an experiment found
    only on the import path) leaves the start to the usual place, after the check."""
    import yaml

    from hpolab.config.experiment import locate_experiment, put_first_on_path
    from hpolab.config.overrides import apply_overrides, parse_overrides

    try:
        raw = yaml.safe_load(Path(spec_path).read_text())
        raw = apply_overrides(raw, parse_overrides(overrides))
        experiment, log_models = raw["experiment"], raw.get("log_models")
        found = locate_experiment(experiment, search_from=Path(spec_path).resolve().parent)
    except Exception:  # load_spec says what is wrong with it
        return False
    if found is None:
        return False
    root, module = found
    put_first_on_path(root)  # the forkserver is given this process's sys.path (load_spec does the same)
    start(module, export_models=log_models != "none")
    return True
