"""Chaos: trial processes and the driver SIGKILLed at random moments; the study still ends right.

A study of short trials on the embedded store. A seeded helper thread SIGKILLs random trial
processes; the test itself SIGKILLs the driver twice at random moments while trials run and
restarts it at once. Afterwards: exactly n_trials finished, nothing RUNNING or WAITING, every
finished Optuna trial has exactly one closed MLflow run with the same state (but an attempt whose
driver died before making its run, which has none and was retried), every retry links to the run it continues, no process of the study is alive, and `hpolab study check` is clean. The counts are printed (pytest -s).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from conftest import hpolab_env, run_cli, start_cli

PROJECT = Path(__file__).parent / "fault_project"
N_TRIALS = 10
ARGS = [f"n_trials={N_TRIALS}", "parallel=2", "trainer.max_epochs=4", "model.sleep=0.02", "max_retries=3",
        "max_failures=null", "pruner={type: none}"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"
    except (FileNotFoundError, IndexError):
        return False


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[1])
    except (FileNotFoundError, IndexError):
        return None


def _trial_pids(pid_dir: Path) -> list[int]:
    return [int(p.stem) for p in pid_dir.glob("*.pid")]


class TrialKiller(threading.Thread):
    """SIGKILLs a random live trial process every 1-3 s (seeded), at most `limit` times."""

    def __init__(self, pid_dir: Path, rng: random.Random, limit: int, drivers: list[int]):
        super().__init__(daemon=True)
        self.pid_dir, self.rng, self.limit, self.drivers = pid_dir, rng, limit, drivers
        self.killed: list[int] = []
        self.stop = threading.Event()

    def _is_our_trial(self, pid: int) -> bool:
        """Alive, and really a trial process of this test's current driver (its forkserver's child):
        pids get recycled (pid_max can be 32768), and a recycled one may be anybody's process."""
        forkserver = _ppid(pid)
        return bool(self.drivers) and _alive(pid) and forkserver is not None and _ppid(forkserver) == self.drivers[-1]

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(1.0, 3.0)) and len(self.killed) < self.limit:
            live = sorted(p for p in _trial_pids(self.pid_dir) if self._is_our_trial(p))
            if live:
                pid = self.rng.choice(live)
                os.kill(pid, signal.SIGKILL)
                self.killed.append(pid)


def _start(store: Path, env: dict):
    return start_cli("--store", str(store), "study", "run", "studies/faulty.yaml", *ARGS, cwd=PROJECT, env=env,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _kill_driver_while_trials_run(driver, pid_dir: Path, rng: random.Random, deadline: float) -> bool:
    """SIGKILL the driver a random 0.2-2.5 s after one of its trials is running; False if it ended first."""
    known = set(_trial_pids(pid_dir))
    while time.monotonic() < deadline and driver.poll() is None:
        if any(_alive(p) for p in set(_trial_pids(pid_dir)) - known):
            time.sleep(rng.uniform(0.2, 2.5))
            if driver.poll() is not None:
                return False
            driver.kill()
            driver.communicate(timeout=120)  # its trials and forkserver follow it (their lifeline)
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_chaos_random_sigkills_of_trials_and_driver(store, tmp_path):
    rng = random.Random(11)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = {**hpolab_env(), "HPOLAB_TEST_PID_DIR": str(pid_dir), "HPOLAB_HEARTBEAT_INTERVAL": "1", "HPOLAB_GRACE_PERIOD": "4"}
    deadline = time.monotonic() + 170
    drivers_killed, driver_pids = 0, []
    killer = TrialKiller(pid_dir, random.Random(rng.random()), limit=5, drivers=driver_pids)
    killer.start()
    while True:
        driver = _start(store, env)
        driver_pids.append(driver.pid)
        if drivers_killed < 2 and _kill_driver_while_trials_run(driver, pid_dir, rng, deadline):
            drivers_killed += 1
            continue
        out, _ = driver.communicate(timeout=max(1, deadline - time.monotonic()))
        break
    killer.stop.set()
    killer.join()
    assert time.monotonic() < deadline, "chaos test ran past its time bound"
    assert driver.returncode == 0, out

    study = optuna.load_study(study_name="faulty", storage=f"sqlite:///{store / 'optuna.db'}")
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    trials = study.get_trials()
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    final = [t for t in trials if t.number not in retried]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)], "a trial left RUNNING/WAITING"
    assert len(final) == N_TRIALS and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) for t in final)

    runs = client.search_runs([client.get_experiment_by_name("faulty").experiment_id], max_results=1000)
    by_trial: dict[int, list] = {}
    for run in runs:
        if "optuna.trial_number" in run.data.tags:
            by_trial.setdefault(int(run.data.tags["optuna.trial_number"]), []).append(run)
    for t in trials:
        if t.number not in by_trial and t.state == TrialState.FAIL and t.number in retried:
            # the driver was killed between asking for the trial and making its run: no run, and
            # its retry (which has one) carries on; `study check` accepts exactly this case
            assert "mlflow_run_id" not in t.user_attrs, t.number
            continue
        (run,) = by_trial[t.number]  # exactly one run per trial
        assert run.info.run_id == t.user_attrs["mlflow_run_id"]
        assert run.info.status != "RUNNING", t.number
        assert run.data.tags["hpolab.state"] == t.state.name, (t.number, run.data.tags)
        history = t.system_attrs.get("retry_history")
        if history:
            assert run.data.tags["hpolab.retry_of_trial"] == str(history[-1])
            if "mlflow_run_id" in trials[history[-1]].user_attrs:  # (the previous attempt may have died runless)
                assert run.data.tags["hpolab.retry_of_run"] == trials[history[-1]].user_attrs["mlflow_run_id"]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in _trial_pids(pid_dir) + driver_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in _trial_pids(pid_dir) + driver_pids if _alive(p)], "a process of the study is still alive"
    check = run_cli("--store", str(store), "study", "check", "faulty", cwd=PROJECT, check=False)
    assert check.returncode == 0, check.stdout + check.stderr  # both stores tell the same story
    print(f"\nCHAOS: {len(killer.killed)} trial processes killed, {drivers_killed} drivers killed, "
          f"{len(trials)} Optuna trials ({len(retried)} retried attempts), final: "
          f"{sum(t.state == TrialState.COMPLETE for t in final)} complete, {sum(t.state == TrialState.FAIL for t in final)} failed; "
          f"invariants held")
