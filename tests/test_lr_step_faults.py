"""The study's LR range test under signals and several workers.

- SIGTERM to the driver's whole process group while the LR range test runs (a terminal closing,
  `docker stop`, a scheduler's preemption): exit 143, the parent run KILLED (not FAILED), and the
  same command resumes the study. Two Ctrl-C to the group: exit 130, same.
- Two workers that start a `from_lr_range_test` study together: the test runs once; the second
  worker uses the first's result.
Each ends with `hpolab study check` clean.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, open_study, run_cli, start_cli

pytestmark = pytest.mark.slow

# The fault project's MLP, slowed (50 ms a forward call) so the 60-step LR range test takes seconds.
ARGS = ["n_trials=2", "parallel=1", "trainer.max_epochs=2", "model.sleep=0.05",
        "lr_range_test={enabled: true, num_steps: 60, min_lr: 1.0e-5, max_lr: 10.0}",
        "search_space={trainer.lr: {type: float, log: true, from_lr_range_test: true}}", "log_models=none"]


class Driver:
    """`hpolab study run` in its own process group (as a shell starts a job), output collected."""

    def __init__(self, store: Path, *args: str, command: str = "study"):
        cmd = ["--store", str(store), *(["study", "run"] if command == "study" else ["worker"]), FAULT_SPEC, *args]
        self.proc = start_cli(*cmd, cwd=FAULT_PROJECT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def wait_for(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None and time.monotonic() < deadline, "".join(self.lines)
            time.sleep(0.1)

    def signal_group(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def finish(self, timeout: float = 300) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=30)
        return code, "".join(self.lines)


def _lr_runs(client, name: str = "faulty") -> list:
    exp = client.get_experiment_by_name(name)
    return client.search_runs([exp.experiment_id], filter_string="attributes.run_name = 'lr-range-test'")


def _assert_resumes(store: Path) -> None:
    out = run_cli("--store", str(store), "study", "run", FAULT_SPEC, *ARGS, cwd=FAULT_PROJECT, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    client, study = open_study(store)
    assert len([t for t in study.get_trials() if t.state == TrialState.COMPLETE]) == 2
    assert len(_lr_runs(client)) == 1
    check = run_cli("--store", str(store), "study", "check", "faulty", cwd=FAULT_PROJECT, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("signals, code", [((signal.SIGTERM,), 143), ((signal.SIGINT, signal.SIGINT), 130)],
                         ids=["sigterm-to-the-group", "two-ctrl-c-to-the-group"])
def test_signals_to_the_group_during_the_lr_range_test(store, signals, code):
    driver = Driver(store, *ARGS)
    driver.wait_for("running the LR range test")
    time.sleep(1.0)  # the test's process is training now
    for sig in signals:
        driver.signal_group(sig)
        time.sleep(0.5)
    rc, out = driver.finish()
    assert rc == code, out
    assert "re-run the same command to resume" in out and "Traceback" not in out, out
    client, study = open_study(store)
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.info.status == "KILLED", (parent.info.status, parent.data.tags.get("hpolab.driver_error"))
    assert not study.get_trials()  # no trial started
    _assert_resumes(store)


def test_two_workers_run_the_lr_range_test_once(store):
    a = Driver(store, *ARGS, command="worker")
    b = Driver(store, *ARGS, command="worker")
    (rc_a, out_a), (rc_b, out_b) = a.finish(), b.finish()
    assert rc_a == 0 and rc_b == 0, out_a + out_b
    client, study = open_study(store)
    (lr_run,) = _lr_runs(client)  # once per study
    attr = study.user_attrs["lr_range_test"]
    assert attr["mlflow_run_id"] == lr_run.info.run_id
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.data.params["lr_range_test.run_id"] == lr_run.info.run_id
    assert float(parent.data.params["search_space.trainer.lr.low"]) == pytest.approx(attr["low"])
    for t in study.get_trials():
        assert attr["low"] <= t.params["trainer.lr"] <= attr["high"]
    assert "using the LR range test another worker ran" in out_a + out_b
    check = run_cli("--store", str(store), "study", "check", "faulty", cwd=FAULT_PROJECT, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
