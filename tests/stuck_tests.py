"""A test still running after pytest-timeout's limit is stuck, most often on a command that never exits.
Its timer (pytest-timeout's signal timer) first prints the Python stacks of every process the test
started that is still alive (py-spy), and its rerun (pytest-rerunfailures, for that failure only) gets
a timer of its own. conftest.py imports the two hooks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's signal timer, which first prints the Python stacks of every process the stuck test
    started that is still alive (py-spy), on the run's own stderr (a rerun that passes drops the test's
    captured output): a stuck test is most often waiting on a command that never exits, and the test's
    own stack does not say where that command is stuck. (No timer thread: a thread in this process
    would change what the in-process tests of the trial forkserver see.)"""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own
    from pytest_timeout import timeout_sigalrm

    def on_alarm(signum, frame):
        __tracebackhide__ = True
        with item.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
            print(f"--- stuck test {item.nodeid}: the stacks of the processes it started", file=sys.stderr, flush=True)
            _descendant_stacks()
        timeout_sigalrm(item, settings)

    def cancel():
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # (pytest-timeout's pytest_timeout_cancel_timer calls it)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


def _descendant_stacks() -> None:
    from conftest import live_processes

    procs = live_processes()
    parents = {pid: ppid for pid, (ppid, _, _) in procs.items()}
    mine, added = {os.getpid()}, True
    while added:
        found = {pid for pid, ppid in parents.items() if ppid in mine} - mine
        mine |= found
        added = bool(found)
    spy = Path(sys.executable).with_name("py-spy")
    for pid in sorted(mine - {os.getpid()}):
        cmdline = procs[pid][2]
        print(f"--- process {pid} (parent {parents.get(pid)}): {cmdline[:300]}", file=sys.stderr, flush=True)
        if spy.exists():
            out = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            print(out.stdout + out.stderr, file=sys.stderr, flush=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """pytest-timeout arms its timer once per test, around every attempt pytest-rerunfailures makes: the
    rerun of a stuck test gets a timer of its own here (its first one has fired)."""
    if getattr(item, "execution_count", 1) > 1:
        from pytest_timeout import _get_item_settings

        settings = _get_item_settings(item)
        if settings.timeout and not settings.func_only:
            item.config.hook.pytest_timeout_set_timer(item=item, settings=settings)
