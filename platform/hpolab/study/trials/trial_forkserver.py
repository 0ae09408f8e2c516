"""The forkserver every trial process is forked from: what it preloads, how it starts, and its start
before the spec is checked.

It holds torch, the routine and the experiment imported (and, when the study logs models, MLflow with
torch.export warmed up); every trial is a fork of that warm process. Importing all that takes
seconds of CPU, and the driver has just paid most of it checking the spec (the check imports the
experiment: torch, scikit-learn). So the forkserver is, where it can be, a fork of the driver taken
right after that check (`_fork_server`): the same multiprocessing forkserver loop and protocol,
started without a new interpreter importing everything again (about 3-4 s of CPU less per study on
the 2-core machine). It then imports only the rest of its preload (the routine, the export warm-up)
while the driver imports MLflow and opens the stores.

Where the driver cannot be forked safely (a Python thread of its own running, gRPC's threads after a
proxy store check, a Python whose forkserver protocol this module does not know), multiprocessing
starts it as a new interpreter. When that is known before the check (all of these but a thread or
gRPC that the experiment's own imports start), `study run` starts that one first, from a quick read
of the spec file (`start_early`), and checks the spec meanwhile; otherwise it starts after the check.
This module imports neither optuna nor pydantic, so that read costs milliseconds.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import threading
from pathlib import Path

from hpolab.config.experiment import forget_bytecode, source_of_file

EXPERIMENT_ENV = "HPOLAB_FORKSERVER_EXPERIMENT"  # read (and removed) by experiment_preload.py in the forkserver
# HPOLAB_FORKSERVER=new: always multiprocessing's own start (a new interpreter), never a fork of the driver:
# for an experiment that imports a library whose own threads a fork would leave behind (Python's threads
# are seen and refused; a C library's are not)
START_ENV = "HPOLAB_FORKSERVER"
# (experiment module, export warm-up, its file's bytes) of the forkserver this process started; None
# before any start. A process that runs several studies (a notebook, a script) keeps one forkserver
# while these stay the same: an experiment edited in between gets a new one, importing the edited file.
_started: tuple[str, bool, bytes | None] | None = None
_fork_allowed = False  # set by allow_fork(): only the `hpolab` command's own process forks its forkserver


def allow_fork() -> None:
    """Let the forkserver be a fork of this process (can_fork_server). `study run` calls it: a fresh
    interpreter that has imported only what the spec check needs. Any other caller (a notebook, a
    test running a driver in its own process) may hold anything (C libraries' threads, a sys.modules
    with packages swapped in and out, which trips torch._dynamo's import) and gets a new interpreter."""
    global _fork_allowed
    _fork_allowed = True


def preload(export_models: bool) -> list[str]:
    """What the forkserver imports before it forks anything (the experiment through experiment_preload.py,
    which reads its name from the environment: see start)."""
    modules = ["hpolab.study.trials.trial_process", "hpolab.study.trials.experiment_preload"]
    if export_models:  # MLflow imported and torch.export warm in every trial (child_export.py)
        modules.append("hpolab.study.trials.export_warm")
    modules.append("hpolab.study.trials.forkserver_exit")  # last: its atexit handler runs first
    return modules


def start(experiment_module: str, export_models: bool, source_file: str | Path | None = None):
    """The forkserver context, its server running (a no-op when it already runs with that preload and
    the experiment's file unchanged; one started with another preload or file, or not by this
    module, is stopped first). Returns the multiprocessing context. `source_file`: the experiment's
    file when this process has not imported it (start_early).

    It starts with Ctrl-C and SIGTERM ignored (an ignored signal stays ignored across exec): a signal
    to the whole process group (a terminal, `docker stop`, Slurm's scancel signals every process of
    the job) would otherwise kill it, and a killed forkserver makes its live trials read as exited
    with code 255 instead of stopping gracefully with their driver. It still ends with the driver
    (its alive pipe closes) and on SIGKILL."""
    import multiprocessing as mp
    from multiprocessing import forkserver

    global _started
    if source_file is None and getattr(sys.modules.get(experiment_module), "__file__", None):
        source_file = sys.modules[experiment_module].__file__
    source = source_file and source_of_file(source_file)
    wanted = (experiment_module, export_models, source)
    if _started is not None and _started[0] == experiment_module and _started[2] != source and source_file:
        forget_bytecode(source_file)  # a new interpreter's import must not take the edited file's old bytecode
    if _started != wanted and forkserver._forkserver._forkserver_pid is not None:
        # One with another preload, or one this module did not start (this process's own code used a
        # forkserver context first: a notebook, a test): multiprocessing keeps one per process and would
        # reuse it, and every trial would import torch and the experiment itself (seconds each).
        stop_now()
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(preload(export_models))
    os.environ[EXPERIMENT_ENV] = experiment_module  # the forkserver inherits the environment at its start
    try:
        if threading.current_thread() is threading.main_thread():
            previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                if export_models and can_fork_server():
                    # The command imports MLflow next anyway; imported before the fork, the server inherits
                    # it instead of importing it again for its export warm-up (~1 s of CPU per study).
                    import mlflow  # noqa: F401
                if can_fork_server():  # (asked after that import: a thread it started would forbid the fork)
                    _fork_server(preload(export_models))
                else:
                    forkserver.ensure_running()
            finally:
                for s, h in previous.items():
                    signal.signal(s, h)
        else:  # signal handlers can only be set from the main thread (a driver run in a thread, in tests)
            forkserver.ensure_running()
    finally:
        os.environ.pop(EXPERIMENT_ENV, None)
    _started = wanted
    return ctx


def can_fork_server() -> bool:
    """Whether the forkserver can be a fork of this process (see the module's docstring): allowed
    (allow_fork: the `hpolab` command; not HPOLAB_FORKSERVER=new), Linux (the fork start method's
    home), no Python thread but this one (a fork copies only the forking thread: a lock another one
    held would stay held in the forkserver and every trial), counted as the interpreter does, not by
    `threading` alone (which misses threads started with _thread: pytest-xdist's channel reader, in a
    test whose fork then hung a trial in torch.tensor), no gRPC (its C core's threads), and the
    multiprocessing.forkserver.main this module was written against (Python 3.11's; one with other
    parameters, such as 3.14's authentication key, gets the usual start)."""
    from multiprocessing import forkserver

    known = list(inspect.signature(forkserver.main).parameters) == [
        "listener_fd", "alive_r", "preload", "main_path", "sys_path"]
    return (_fork_allowed and os.environ.get(START_ENV) != "new" and sys.platform == "linux" and known
            and _threads() == 1 and "grpc" not in sys.modules)


def _threads() -> int:
    """This process's Python threads, however started (those running Python code). Not the C
    libraries' own: OpenBLAS starts its pool when numpy is imported and handles a fork itself; torch's
    pool starts at its first computation, which the command's process leaves to its trials."""
    return max(threading.active_count(), len(sys._current_frames()))


def _fork_server(modules: list[str]) -> None:
    """multiprocessing's forkserver for this process, started as a fork of it (what
    forkserver.ensure_running does, with os.fork where it starts a new interpreter): a no-op while
    one runs. The forked server imports what `modules` adds to what this process already holds,
    then serves; it ends with os._exit, never running this process's atexit handlers (MLflow's,
    the stores'): they are the driver's to run."""
    import socket
    from multiprocessing import connection, forkserver, resource_tracker, util

    server = forkserver._forkserver
    with server._lock:
        resource_tracker.ensure_running()
        if server._forkserver_pid is not None:
            pid, _ = os.waitpid(server._forkserver_pid, os.WNOHANG)
            if not pid:
                return  # still alive
            os.close(server._forkserver_alive_fd)  # dead: start another, as ensure_running does
            server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            # every client holds the write end of "alive"; the server leaves when it reads EOF
            alive_r, alive_w = os.pipe()
            for stream in (sys.stdout, sys.stderr):  # or the server would print this process's buffered text again
                stream.flush()
            try:
                pid = os.fork()
            except OSError:
                os.close(alive_r)
                os.close(alive_w)
                raise
            if pid == 0:
                _serve(server, listener.fileno(), alive_r, alive_w, modules)  # (never returns)
            os.close(alive_r)
        server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid


def _serve(server, listener_fd: int, alive_r: int, alive_w: int, modules: list[str]) -> None:
    """The forked server's whole life: multiprocessing's forkserver loop, then os._exit (never this
    process's atexit handlers). The lock held while forking is replaced: every trial forked from here
    would otherwise inherit it held, and hang in any forkserver start of its own (a DataLoader with a
    forkserver context). A crash says why on stderr and exits 1, as a new interpreter's would."""
    import traceback
    from multiprocessing import forkserver

    code = 1
    try:
        server._lock = threading.Lock()
        os.close(alive_w)
        forkserver.main(listener_fd, alive_r, modules)
    except SystemExit:  # its driver is gone: the loop's normal end
        code = 0
    except BaseException:  # noqa: BLE001 -- said, then the exit code
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


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


def stop_before_exit() -> None:
    """stop_now, for a command about to exit on a failed check: multiprocessing's resource tracker,
    which the forkserver's start started, is stopped too and waited for. It would end on its own
    once this process exits (its pipe closes), but after it: for a moment the command would leave a
    process behind. (Not in stop_now: a driver that starts another forkserver keeps its tracker.)"""
    from multiprocessing import resource_tracker

    stop_now()
    resource_tracker._resource_tracker._stop()  # no public stop; closes its pipe and waits for it


def start_early(spec_path: str, overrides: list[str]) -> bool:
    """Start the forkserver for the spec file before the spec is checked, when it cannot be a fork of
    this process (can_fork_server) and a quick read finds its experiment as a file in a project's
    experiments/ folder (where load_experiment will import it from). Returns whether it started;
    anything unusual (an unreadable spec, an experiment found only on the import path) leaves the
    start to the usual place, after the check."""
    import yaml

    from hpolab.config.experiment import locate_experiment, module_file, put_first_on_path
    from hpolab.config.overrides import apply_overrides, parse_overrides

    if can_fork_server():  # the check's imports are the forkserver's: it is forked after them (start)
        return False
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
    start(module, export_models=log_models != "none", source_file=module_file(root, module))
    return True
