"""Ctrl-C in a Python process running `hpolab.run_study`: a real SIGINT to a script's process.

The first SIGINT stops the study as it stops `hpolab study run` (running trials checkpoint and are
queued to resume), then run_study raises KeyboardInterrupt with the caller's signal handlers back:
a notebook's kernel stays usable, a script ends as Python ends on Ctrl-C. The stores agree (`hpolab
study check`), and run_study again continues the study from the trials' checkpoints.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import FAULT_PROJECT, ROOT, hpolab_env, open_study, run_cli, wait_for_checkpoints

ARGS = ["n_trials=2", "parallel=2", "trainer.max_epochs=8", "model.sleep=0.03", "log_models=none"]


def _script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def _env() -> dict[str, str]:
    return {**hpolab_env(), "PYTHONPATH": str(ROOT / "platform")}


def test_importing_the_api_installs_no_signal_handlers():
    # (fast) the signal handling of the driver is only installed by run(): importing the API installs none
    # (compared with the handlers the interpreter started with: a shell's background job starts with SIGINT ignored)
    code = ("import signal; before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)\n"
            "import hpolab; hpolab.run_study; import hpolab.api.running, hpolab.study.driver.signals\n"
            "print(signal.getsignal(signal.SIGINT) is before[0], signal.getsignal(signal.SIGTERM) is before[1])")
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]


@pytest.mark.slow
def test_sigint_raises_keyboard_interrupt_with_the_stores_consistent_and_a_rerun_continues(store, tmp_path):
    first = _script(tmp_path, "first.py", f"""
        import signal, sys
        import hpolab

        before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)  # (SIG_IGN in a shell's background job)
        try:
            hpolab.run_study("studies/faulty.yaml", {ARGS!r}, store={str(store)!r})
        except KeyboardInterrupt as e:
            restored = signal.getsignal(signal.SIGINT) is before[0] and signal.getsignal(signal.SIGTERM) is before[1]
            print("KeyboardInterrupt:", e, "| handlers restored:", restored, flush=True)
            raise
    """)
    proc = subprocess.Popen(first, cwd=FAULT_PROJECT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_checkpoints(store, 2)  # both trials are mid-training
        proc.send_signal(signal.SIGINT)  # the script's process only, as a kernel's interrupt does
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGINT, out + err  # Python's exit on an uncaught KeyboardInterrupt
    assert "Traceback" in err and err.rstrip().endswith("KeyboardInterrupt: interrupted by Ctrl-C with 0/2 trials finished; "
                                                        "re-run the same command to resume"), err
    assert "handlers restored: True" in out
    assert "Ctrl-C: starting no new trials" in out  # the driver's graceful stop, as on the CLI
    check = run_cli("--store", str(store), "study", "check", "faulty", cwd=FAULT_PROJECT, check=False)
    assert check.returncode == 0, check.stdout + check.stderr

    _, study = open_study(store)
    waiting = [t for t in study.get_trials() if t.state.name == "WAITING"]
    assert len(waiting) == 2  # the interrupted trials, queued to resume

    second = _script(tmp_path, "second.py", f"""
        import json
        import hpolab

        study = hpolab.run_study("studies/faulty.yaml", {ARGS!r}, store={str(store)!r}, progress=False)
        df = study.trials_df()
        print(json.dumps(sorted(df["state"])))
    """)
    done = subprocess.run(second, cwd=FAULT_PROJECT, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    client, study = open_study(store)
    finished = [t for t in study.get_trials() if t.state.name == "COMPLETE"]
    assert len(finished) == 2
    for t in finished:  # each continued an interrupted attempt from its checkpoint
        tags = client.get_run(t.user_attrs["mlflow_run_id"]).data.tags
        assert "hpolab.retry_of_trial" in tags and tags.get("hpolab.resume_source") == "local", tags
    assert json.loads(done.stdout.strip().splitlines()[-1]).count("COMPLETE") == 2
    assert run_cli("--store", str(store), "study", "check", "faulty", cwd=FAULT_PROJECT, check=False).returncode == 0


def _execute(kc, code: str, timeout: float = 300) -> dict:
    """Run `code` in the kernel; its execute_reply content, with the text it printed under "stdout"."""
    msg_id = kc.execute(code)
    printed = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=timeout)["content"]
    return {**reply, "stdout": "".join(printed)}


@pytest.mark.slow
def test_interrupting_a_kernel_keeps_it_usable_and_a_second_run_study_continues(store):
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(FAULT_PROJECT), env=_env())
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        before = _execute(kc, "import os, signal, hpolab\nforks = []\nos.register_at_fork(before=lambda: forks.append(1))\n"
                              "handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))")
        assert before["status"] == "ok", before
        msg_id = kc.execute(f"hpolab.run_study('studies/faulty.yaml', {ARGS!r}, store={str(store)!r}, progress=False)")
        wait_for_checkpoints(store, 2)
        km.interrupt_kernel()  # what Jupyter's stop button sends: SIGINT to the kernel process
        while True:
            reply = kc.get_shell_msg(timeout=120)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        assert "interrupted by Ctrl-C" in reply["content"]["evalue"]
        check = run_cli("--store", str(store), "study", "check", "faulty", cwd=FAULT_PROJECT, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        again = _execute(kc, f"s = hpolab.run_study('studies/faulty.yaml', {ARGS!r}, store={str(store)!r}, progress=False)\n"
                             "df = s.trials_df()\n"
                             "print(sorted(df['state']), sorted(df['fail_reason'].dropna().str[:31]), "
                             "(signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers, forks)")
        assert again["status"] == "ok", again
        # the two interrupted attempts (FAIL, retried) and their continuations; the kernel's handlers back; it forked nothing
        assert again["stdout"].strip() == ("['COMPLETE', 'COMPLETE', 'FAIL', 'FAIL'] ['interrupted (Ctrl-C or SIGTERM)', "
                                           "'interrupted (Ctrl-C or SIGTERM)'] True []")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
