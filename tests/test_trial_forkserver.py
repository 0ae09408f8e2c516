"""The trials' forkserver: a fork of the `hpolab` command once its spec check has imported torch and
the experiment, unless that is unsafe or HPOLAB_FORKSERVER=new asks for multiprocessing's own start
(a new interpreter importing everything again)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, live_processes

PROBE = """
import threading
import time
from hpolab.study.trials import trial_forkserver as t
print(t.can_fork_server())  # not the hpolab command (a notebook, a test's own driver): never
t.allow_fork()
print(t.can_fork_server())
done = threading.Event()
thread = threading.Thread(target=done.wait)
thread.start()
print(t.can_fork_server())  # a thread of ours would be lost in the fork, holding whatever lock it held
done.set()
thread.join()
import _thread
lock = _thread.allocate_lock()
lock.acquire()
def reader():
    lock.acquire()
_thread.start_new_thread(reader, ())  # a thread threading does not know of (pytest-xdist's channel reader)
time.sleep(0.2)
print(t.can_fork_server())
lock.release()
time.sleep(0.2)
import grpc
print(t.can_fork_server())  # gRPC's C core runs threads of its own
"""


@pytest.mark.parametrize("start, expected", [(None, "False True False False False"), ("new", "False False False False False")])
def test_the_fork_is_refused_outside_the_command_with_threads_grpc_or_when_asked(start, expected):
    env = {k: v for k, v in hpolab_env().items() if k != "HPOLAB_FORKSERVER"}
    if start:
        env["HPOLAB_FORKSERVER"] = start
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert " ".join(out.stdout.split()) == expected


NESTED = """
import multiprocessing as mp
from hpolab.study.trials import trial_forkserver


def grandchild():
    pass


def child():  # a trial whose own code starts a process with a forkserver context (a DataLoader may)
    p = mp.get_context("forkserver").Process(target=grandchild)
    p.start()
    p.join()
    assert p.exitcode == 0


if __name__ == "__main__":
    trial_forkserver.allow_fork()
    assert trial_forkserver.can_fork_server()
    trial_forkserver._fork_server([])
    p = mp.get_context("forkserver").Process(target=child)
    p.start()
    p.join(60)
    print(p.exitcode)
    if p.exitcode is None:
        p.kill()
"""


def test_a_trial_of_the_forked_server_can_start_a_forkserver_of_its_own(tmp_path):
    # The lock multiprocessing holds while it starts a forkserver is held when the fork is taken: the
    # forked server must free it, or every trial inherits it held and hangs in a start of its own.
    script = tmp_path / "nested.py"
    script.write_text(NESTED)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=hpolab_env(), capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0 and out.stdout.split() == ["0"], out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("start", ["fork", "new"])
def test_trials_run_from_a_fork_of_the_command_or_from_a_new_interpreter(store, tmp_path, start):
    exe = Path(sys.executable).with_name("hpolab")
    out = tmp_path / "out"
    with out.open("w") as o:
        # model.sleep: each forward pass sleeps, so the trial is running while we look
        driver = subprocess.Popen([str(exe), "--store", str(store), "study", "run", FAULT_SPEC, "n_trials=1",
                                   "trainer.max_epochs=1", "log_models=none", "model.sleep=0.05"], cwd=FAULT_PROJECT,
                                  env={**hpolab_env(), "HPOLAB_FORKSERVER": start}, stdout=o, stderr=subprocess.STDOUT)
        server = None
        deadline = time.monotonic() + 240
        while server is None and driver.poll() is None and time.monotonic() < deadline:
            procs = live_processes()
            # the forkserver: the driver's child that has a child (the trial) of its own
            parents = {parent for parent, _, _ in procs.values()}
            server = next((pid for pid, (parent, _, _) in procs.items() if parent == driver.pid and pid in parents), None)
            time.sleep(0.05)
        assert server is not None, out.read_text()
        server_cmdline, driver_cmdline = procs[server][2], procs[driver.pid][2]
        assert driver.wait(timeout=300) == 0, out.read_text()
    if start == "fork":
        assert server_cmdline == driver_cmdline  # no new interpreter: the command's own image
    else:
        assert "from multiprocessing.forkserver import main" in server_cmdline
    assert "COMPLETE" in out.read_text()


def test_a_forkserver_other_code_started_first_is_replaced_by_one_with_the_trials_preload(monkeypatch):
    """A driver run in a process that used a forkserver context before (a notebook, a test): multiprocessing
    keeps one forkserver per process and would give the trials that one, without torch and the experiment
    preloaded, so that every trial imported them itself (seconds each: test_driver_fds took 34 s instead
    of 8 after test_child_export's forkserver, in one pytest process)."""
    import multiprocessing as mp
    from multiprocessing import forkserver

    from hpolab.study.trials import trial_forkserver

    # as in a notebook: no `hpolab` command ran in this process (one run in-process earlier in this
    # pytest worker, hpolab.cli.main, allows a forked server for the rest of the process)
    monkeypatch.setattr(trial_forkserver, "_fork_allowed", False)
    first = mp.get_context("forkserver").Process(target=time.sleep, args=(0,))
    first.start()
    first.join(120)
    foreign = forkserver._forkserver._forkserver_pid
    assert foreign is not None and "hpolab.study.trials.trial_process" not in Path(f"/proc/{foreign}/cmdline").read_text()
    try:
        trial_forkserver.start("experiments.digits_cnn", export_models=False)
        ours = forkserver._forkserver._forkserver_pid
        assert ours != foreign and foreign not in live_processes()
        assert "hpolab.study.trials.trial_process" in Path(f"/proc/{ours}/cmdline").read_text()  # its preload, passed by -c
    finally:
        trial_forkserver.stop_now()
