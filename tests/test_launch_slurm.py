"""`hpolab launch slurm` on a real single-node Slurm (scripts/slurm-local): the real sbatch, 2 array
tasks sharing one study, the exact budget, the Slurm tags on every trial run, and scancel leaving a
resumable study that a second launch completes.

Skipped, with the reason, where Slurm is not installed (scripts/system-deps installs it). When Slurm
is installed but not running and the tests run as root, the module starts it and stops it after.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, ROOT, open_study, run_cli, trial_run

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("sbatch") is None,
                                 reason="Slurm is not installed (sudo scripts/system-deps installs slurmctld, slurmd, slurm-client, munge)")]

TINY = ["parallel=1", "trainer.max_epochs=2", "sampler={type: random}", "log_models=none"]


def _slurm_answers() -> bool:
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and any(s.startswith(("idle", "mixed", "alloc")) for s in out.stdout.split())


@pytest.fixture(scope="module")
def slurm():
    started = False
    if not _slurm_answers():
        if os.geteuid() != 0:
            pytest.skip("Slurm is installed but not running: sudo scripts/slurm-local start")
        subprocess.run([str(ROOT / "scripts" / "slurm-local"), "start"], check=True, timeout=300)
        started = True
    yield
    if started:
        subprocess.run([str(ROOT / "scripts" / "slurm-local"), "stop"], timeout=300)


def _launch(store: Path, logs: Path, *args: str) -> str:
    out = run_cli("--store", str(store), "launch", "slurm", FAULT_SPEC, *args, "--workers", "2", "--single-node",
                  "--log-dir", str(logs), cwd=FAULT_PROJECT).stdout
    m = re.search(r"submitted Slurm job (\d+)", out)
    assert m, out
    assert f"squeue -j {m[1]}" in out and f"scancel {m[1]}" in out and "study status" in out
    return m[1]


def _in_queue(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True, timeout=60)
    return out.returncode == 0 and bool(out.stdout.strip())


def _wait_until(condition, what: str, ceiling: float = 600) -> None:
    deadline = time.monotonic() + ceiling
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {ceiling:.0f} s")


def _logs(logs: Path, job_id: str) -> str:
    return "\n".join(p.read_text() for p in sorted(logs.glob(f"*-{job_id}_*.out")))


def test_two_array_tasks_share_the_budget_and_tag_their_runs(slurm, store, tmp_path):
    logs = tmp_path / "logs"
    job = _launch(store, logs, "name=slurm-a", "n_trials=4", *TINY)
    _wait_until(lambda: not _in_queue(job), f"Slurm job {job} to finish")
    client, study = open_study(store, "slurm-a")
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4, _logs(logs, job)  # exactly the budget
    node = socket.gethostname().split(".")[0]
    seeds: dict[str, set[str]] = {}
    for t in trials:
        tags = trial_run(t, client).data.tags
        assert tags["env.slurm_array_job_id"] == job
        assert tags["env.slurm_array_task_id"] in ("0", "1")
        assert tags["env.slurm_job_id"].isdigit() and tags["env.slurm_node"] == node
        seeds.setdefault(tags["env.slurm_array_task_id"], set()).add(tags["hpolab.worker_seed"])
        assert str(t.user_attrs["worker_seed"]) == tags["hpolab.worker_seed"]
    assert all(len(s) == 1 for s in seeds.values())
    if len(seeds) == 2:  # both workers ran trials (the usual case): each had its own sampler salt
        assert seeds["0"] != seeds["1"]


def test_scancel_leaves_a_resumable_study_and_a_relaunch_completes_it(slurm, store, tmp_path):
    logs = tmp_path / "logs"
    args = ["name=slurm-b", "n_trials=2", "parallel=1", "trainer.max_epochs=20", "model.sleep=0.03",
            "sampler={type: random}", "log_models=none"]
    job = _launch(store, logs, *args)
    trial_dirs = store / "trials" / "slurm-b"
    _wait_until(lambda: len(list(trial_dirs.glob("trial-*/last.pt"))) >= 2, "both workers to checkpoint a trial")
    subprocess.run(["scancel", job], check=True, timeout=60)
    _wait_until(lambda: not _in_queue(job), f"cancelled job {job} to leave the queue", ceiling=300)
    text = _logs(logs, job)
    assert text.count("SIGTERM: starting no new trials") == 2, text  # exec: each worker got the signal itself
    client, study = open_study(store, "slurm-b")
    trials = study.get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING], text
    stopped = [t for t in trials if t.state == TrialState.FAIL]
    states = [(t.number, t.state.name, t.system_attrs) for t in trials]
    assert stopped and len([t for t in trials if t.state == TrialState.WAITING]) == len(stopped), (states, text)  # queued to resume

    again = _launch(store, logs, *args)
    _wait_until(lambda: not _in_queue(again), f"Slurm job {again} to finish")
    client, study = open_study(store, "slurm-b")
    trials = study.get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)], _logs(logs, again)
    assert len([t for t in trials if t.state == TrialState.COMPLETE]) == 2
    resumed = [t for t in trials if t.system_attrs.get("retry_history")]
    assert resumed and all(trial_run(t, client).data.tags["env.slurm_array_job_id"] == again for t in resumed)
