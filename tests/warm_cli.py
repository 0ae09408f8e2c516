"""A warm interpreter for the tests' `hpolab` commands: run_cli and start_cli fork it instead of starting Python.

Most of a short command's CPU is importing torch, MLflow, Optuna and what they pull in (about 5 s on
the 2-core machine, for a study whose training takes a second). The suite runs some 250 such commands,
so each pytest process starts one of these servers: it imports those libraries once, then forks a
child per command. The child is set up as subprocess.Popen([hpolab, ...]) would have started it (its
own stdin/stdout/stderr, working directory, environment, import path, argv, a new session if asked)
and runs the installed console script itself (runpy), so the command runs the same code from its first
line on; its `hpolab` modules are imported fresh in the child (none are held here: several read the
environment at import). The test gets the command's pid (signals reach the command itself), its
output, and its exit code (from the server, its parent).

What differs from a new interpreter: the libraries above are already imported, under the server's
environment (the tests' own; MLflow's telemetry is off here and set up again in the child from the
command's environment, as MLflow's import does); a tiny model was already exported once (torch.export,
ONNX, TorchScript: their lazy imports are done) and what the warm-up built is frozen out of the garbage
collector's sight; the process's parent is the server, not pytest; and
its /proc/PID/cmdline and /proc/PID/environ are the server's (os.environ is the command's). Tests that
look at those start the console script with subprocess.Popen (test_chaos, test_trial_forkserver, the
`ui` tests). HPOLAB_TEST_FRESH_CLI=1 makes run_cli and start_cli start a new interpreter for every
command: the suite passes either way, and test_warm_cli.py compares the two.

The server is a single thread (it forks: no lock of another thread may be copied held); it reaps its
children itself and exits when the pytest process that started it goes away.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# What hpolab's commands import from other packages comes in through these modules (then hpolab's
# own modules are dropped again: see above). Not the gRPC storage proxy: a process holding gRPC may
# not fork its forkserver, and commands that use no proxy never import it.
WARM = ["hpolab.cli", "hpolab.study.driver.driver", "hpolab.study.trials.trial_process", "hpolab.study.trials.child_export",
        "hpolab.registry.promote", "hpolab.registry.predict", "hpolab.analysis.compare.command", "hpolab.analysis.check",
        "hpolab.analysis.report.command", "hpolab.train.lr_range_test",
        # imported lazily by MLflow once a study's runs are logged (its tracing's metrics export)
        "mlflow.tracing.export.utils", "mlflow.tracing.processor.otel", "mlflow.utils.search_logged_model_utils",
        # imported by `report`'s figures when they are drawn
        "plotly.graph_objects", "optuna.visualization"]
READY = b"ready\n"


# ---- the server (python tests/warm_cli.py SOCKET)

def _warm_up() -> list[str]:
    import gc
    import importlib

    for name in WARM:
        importlib.import_module(name)
    _open_stores_once()
    _export_once()
    assert "grpc" not in sys.modules, "warming up imported gRPC: the commands could no longer fork their forkserver"
    for name in [n for n in sys.modules if n == "hpolab" or n.startswith("hpolab.")]:
        del sys.modules[name]
    assert threading.active_count() == 1, "warming up left a thread running: the server could not fork safely"
    # What the warm-up built stays for the server's life: out of the garbage collector's sight, a
    # command's collections do not walk it (each walked the whole heap: a `predict` took about 1 s of
    # CPU instead of 0.4) and do not write to its pages, which the fork shares (gc.freeze's documented use).
    gc.collect()
    gc.freeze()
    return [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]


def _open_stores_once() -> None:
    """Open an Optuna and an MLflow store in a throwaway folder, log a run, close them: what a command's
    first use of a store imports lazily (SQLAlchemy's ORM and SQLite dialect, alembic, MLflow's SQL
    store) is then imported here too. Nothing opened stays open: every engine is disposed, and the
    server holds no descriptor or thread it did not hold before (checked)."""
    import gc
    import logging

    import optuna
    import sqlalchemy
    from mlflow import MlflowClient

    fds, threads = sorted(os.listdir("/proc/self/fd")), threading.active_count()
    logging.disable(logging.INFO)  # MLflow's "creating initial database tables" (restored below)
    with tempfile.TemporaryDirectory() as folder:
        optuna.storages.RDBStorage(f"sqlite:///{folder}/optuna.db").engine.dispose()
        client = MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db")
        run = client.create_run(client.create_experiment("warm", artifact_location=f"{folder}/artifacts"))
        client.log_metric(run.info.run_id, "m", 1.0, step=1)
        client.set_terminated(run.info.run_id)
        del client, run
        for engine in [o for o in gc.get_objects() if type(o) is sqlalchemy.engine.Engine]:
            engine.dispose()
    logging.disable(logging.NOTSET)
    assert sorted(os.listdir("/proc/self/fd")) == fds and threading.active_count() == threads, "the store warm-up left something open"


def _export_once() -> None:
    """A throwaway save and load of a tiny model (torch.export, MLflow's pytorch flavour, its requirement
    check) and its ONNX and TorchScript exports: what promote and predict import lazily on their first
    call (torch.export's and ONNX's modules, sympy, networkx) is then imported here too.

    One backward pass first: autograd decides at its first backward pass whether to start its device
    threads, and starts them once torch.export has registered a device type (tests/conftest.py's
    _autograd_without_device_threads says more). Decided here before the export, no command forked from
    this server finds autograd refusing to run in a fork. On one thread, as child_export.warm: no OpenMP
    pool may be running in a process that forks."""
    import io
    import warnings

    import torch

    from hpolab.study.trials import child_export

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecations of the TorchScript exporters: promote's own output says them
            x = torch.zeros(1, requires_grad=True)
            (x * 2).sum().backward()
            child_export.warm()
            model = torch.nn.Sequential(torch.nn.Linear(2, 2)).eval()
            example = torch.zeros(1, 2)
            torch.onnx.export(model, (example,), io.BytesIO(), dynamo=False)
            torch.jit.save(torch.jit.trace(model, (example,), check_trace=False), io.BytesIO())
    finally:
        torch.set_num_threads(threads)


def serve(path: str) -> None:
    base_path = _warm_up()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    os.write(1, READY)
    incoming: dict[socket.socket, tuple[bytearray, list[int]]] = {}
    running: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([0, listener, *incoming], [], [], 0.05)
        if 0 in readable and not os.read(0, 1):
            os._exit(0)  # the pytest process is gone (its end of our stdin closed)
        if listener in readable:
            conn, _ = listener.accept()
            incoming[conn] = (bytearray(), [])
        for conn in [c for c in readable if c in incoming]:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            buf, got = incoming[conn]
            buf += data
            got += fds
            if not data:
                del incoming[conn]
                conn.close()
            elif buf.endswith(b"\n"):
                del incoming[conn]
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in [conn, *incoming, *running.values()]:
                        other.close()
                    for _, theirs in incoming.values():  # another command's descriptors, still arriving
                        for fd in theirs:
                            os.close(fd)
                    _command(json.loads(buf), got, base_path)  # never returns
                for fd in got:
                    os.close(fd)
                conn.sendall(f"{pid}\n".encode())
                running[pid] = conn
        _reap(running)


def _reap(running: dict[int, socket.socket]) -> None:
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = running.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:  # run_cli gave up on it (a timeout)
                pass
            conn.close()


def _command(msg: dict, fds: list[int], base_path: list[str]) -> None:
    """In the forked child: become the command subprocess.Popen would have started, then run it."""
    if msg["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(msg["cwd"])
    os.environ.clear()
    os.environ.update(msg["env"])
    tempfile.tempdir = None  # read again from the command's TMPDIR, as a new process would
    argv = msg["argv"]
    script = argv[0] if Path(argv[0]).name == "hpolab" else None
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [str(Path(script).parent) if script else os.getcwd(), *extra, *base_path]
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = sys.__stdout__ = _writer(1, unbuffered, "strict")
    sys.stderr = sys.__stderr__ = _writer(2, unbuffered, "backslashreplace")
    from mlflow.telemetry import set_telemetry_client

    set_telemetry_client()  # what MLflow's import does, now under the command's environment
    import runpy

    code = 0
    try:
        if script:
            sys.argv = list(argv)
            runpy.run_path(script, run_name="__main__")
        else:  # python -m hpolab.cli ...
            sys.argv = ["hpolab", *argv[3:]]
            runpy.run_module("hpolab.cli", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 -- what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    from hpolab.console import finish

    finish()  # what the interpreter would do at its exit (console.run does the same after main())
    if code == -signal.SIGINT:  # how Python reports an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _writer(fd: int, unbuffered: bool, errors: str) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), errors=errors,
                            line_buffering=fd == 2 and not unbuffered, write_through=unbuffered)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


# ---- the pytest side

class WarmCli:
    """One server per pytest process (conftest starts it before the first test; its warm-up overlaps the
    first tests, and the first command waits for it)."""

    def __init__(self, env: dict[str, str], cwd: Path):
        self.folder = tempfile.mkdtemp(prefix="hpolab-warm-")
        self.path = os.path.join(self.folder, "cli.sock")
        env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        env["MLFLOW_DISABLE_TELEMETRY"] = "true"  # no telemetry thread in a process that forks
        self.proc = subprocess.Popen([sys.executable, __file__, self.path], cwd=cwd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        atexit.register(self.stop)
        self.ready = False

    def _wait_ready(self) -> None:
        if not self.ready:
            line = self.proc.stdout.readline()
            if line != READY:
                raise RuntimeError(f"the warm hpolab interpreter did not start (exit {self.proc.wait()})")
            self.ready = True

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # it exits on EOF
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        try:
            os.unlink(self.path)
            os.rmdir(self.folder)
        except OSError:
            pass

    def start(self, cmd: list[str], cwd: Path, env: dict[str, str], **popen) -> "WarmProcess":
        """The command, started as subprocess.Popen(cmd, cwd=..., env=..., **popen) would start it."""
        self._wait_ready()
        return WarmProcess(self.path, cmd, cwd, env, **popen)

    def run(self, cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        """subprocess.run(cmd, cwd=..., env=..., capture_output=True, text=True, timeout=...)."""
        proc = self.start(cmd, cwd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


class WarmProcess:
    """A command WarmCli started: what the tests use of subprocess.Popen (pid, stdout, stderr, poll, wait,
    communicate, send_signal, terminate, kill). `pid` is the command's own process, so signals reach it
    as they would reach a process Popen started; its exit code comes from the warm server, its parent.
    stdin is inherited or DEVNULL; stdout and stderr inherited, PIPE, DEVNULL, STDOUT (stderr) or a file."""

    def __init__(self, path: str, args: list[str], cwd: Path, env: dict[str, str], stdin=None, stdout=None,
                 stderr=None, text: bool = False, start_new_session: bool = False):
        self.args, self.returncode, self.text = args, None, text
        self.stdout = self.stderr = None
        opened: list[int] = []  # ours to close once sent
        child_stdin = _target(stdin, 0, opened)
        child_stdout = _target(stdout, 1, opened)
        child_stderr = child_stdout if stderr == subprocess.STDOUT else _target(stderr, 2, opened)
        if stdout == subprocess.PIPE:
            self.stdout, child_stdout = self._pipe(opened)
            child_stderr = child_stdout if stderr == subprocess.STDOUT else child_stderr
        if stderr == subprocess.PIPE:
            self.stderr, child_stderr = self._pipe(opened)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        msg = {"argv": args, "cwd": str(cwd), "env": env, "new_session": start_new_session}
        socket.send_fds(self._sock, [json.dumps(msg).encode() + b"\n"], [child_stdin, child_stdout, child_stderr])
        for fd in opened:
            os.close(fd)
        self._reply = b""
        self.pid = int(self._line(None))
        self._chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}

    def _pipe(self, opened: list[int]):
        r, w = os.pipe()
        opened.append(w)
        return (open(r, "r") if self.text else open(r, "rb")), w

    def _line(self, timeout: float | None) -> bytes | None:
        """The server's next line (the pid, then the exit code); None if it has not come by the timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._reply:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._sock], [], [], left)[0]:
                return None
            data = self._sock.recv(64)
            if not data:
                raise RuntimeError("the warm hpolab interpreter went away")
            self._reply += data
        line, self._reply = self._reply.split(b"\n", 1)
        return line

    def poll(self) -> int | None:
        return self.wait(0, raise_timeout=False)

    def wait(self, timeout: float | None = None, raise_timeout: bool = True) -> int | None:
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                if raise_timeout:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                return None
            self.returncode = int(line)
            self._sock.close()
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None):
        """Everything on the piped stdout/stderr, to their end, then the exit; TimeoutExpired keeps what
        was read for the next call (as Popen does)."""
        assert input is None, "stdin is never a pipe here"
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = {getattr(self, name).fileno(): name for name in ("stdout", "stderr")
                   if getattr(self, name) is not None and not getattr(self, name).closed}
        while pending:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            for fd in select.select(list(pending), [], [], left)[0]:
                data = os.read(fd, 1 << 16)
                if data:
                    self._chunks[pending[fd]].append(data)
                else:
                    getattr(self, pending.pop(fd)).close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return tuple(None if getattr(self, name) is None else self._decode(b"".join(self._chunks[name]))
                     for name in ("stdout", "stderr"))

    def _decode(self, data: bytes):
        return _text(data) if self.text else data

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


def _target(spec, inherited: int, opened: list[int]) -> int:
    """The descriptor the command gets for a Popen stdin/stdout/stderr argument (PIPE: set by the caller)."""
    if spec is None or spec == subprocess.PIPE or spec == subprocess.STDOUT:
        return inherited
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd
    return spec if isinstance(spec, int) else spec.fileno()


def _text(data: bytes) -> str:
    """As subprocess.run(text=True) decodes: the locale's encoding, universal newlines."""
    return io.TextIOWrapper(io.BytesIO(data)).read()


if __name__ == "__main__":
    serve(sys.argv[1])
