"""The CPUs a process may use (train/cpus.py): its affinity mask capped by its cgroup's CPU quota --
not os.cpu_count(), the machine's cores. A Slurm task with --cpus-per-task 4 on a 64-core node, or a
container with a 4-CPU quota, must not set 32 torch threads per trial."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, open_study, trial_run
from hpolab.train.cpus import available_cpus, cgroup_cpu_limit


def _fs(tmp_path: Path, cgroup: str, files: dict[str, str]) -> Path:
    """A fabricated root: proc/self/cgroup and files under sys/fs/cgroup."""
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        p = tmp_path / "sys" / "fs" / "cgroup" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


@pytest.mark.parametrize("cgroup, files, limit", [
    # cgroup v2: the process's cgroup and its ancestors, the smallest quota
    ("0::/job/step\n", {"job/step/cpu.max": "max 100000\n", "job/cpu.max": "400000 100000\n", "cpu.max": "max 100000\n"}, 4.0),
    ("0::/job/step\n", {"job/step/cpu.max": "150000 100000\n", "job/cpu.max": "400000 100000\n"}, 1.5),
    ("0::/\n", {"cpu.max": "max 100000\n"}, None),  # "max": no quota
    ("0::/gone\n", {"cpu.max": "200000 100000\n"}, 2.0),  # the cgroup's folder not mounted here (another namespace): its root's
    # cgroup v1: the cpu controller's cfs quota/period (-1: no quota), under its mount folder
    ("4:memory:/x\n2:cpu,cpuacct:/slurm/job\n", {"cpu,cpuacct/slurm/job/cpu.cfs_quota_us": "300000\n",
                                                 "cpu,cpuacct/slurm/job/cpu.cfs_period_us": "100000\n"}, 3.0),
    ("1:cpu:/\n0::/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ("", {}, None),  # nothing readable: no cap
])
def test_cgroup_quota_of_fabricated_files(tmp_path, cgroup, files, limit):
    assert cgroup_cpu_limit(_fs(tmp_path, cgroup, files)) == limit


def test_available_cpus_is_the_affinity_mask_capped_by_the_quota(tmp_path):
    mask = len(os.sched_getaffinity(0))
    assert available_cpus(_fs(tmp_path / "none", "0::/\n", {"cpu.max": "max 100000\n"})) == mask
    assert available_cpus(_fs(tmp_path / "half", "0::/\n", {"cpu.max": "50000 100000\n"})) == 1  # at least one
    assert available_cpus(_fs(tmp_path / "many", "0::/\n", {"cpu.max": "6400000 100000\n"})) == mask  # the mask is smaller


@pytest.mark.slow
def test_a_study_under_taskset_records_one_thread_per_trial(store):
    """`taskset -c 0 hpolab study run ...` (as Slurm's --cpus-per-task binds a task) at parallel=1: each
    trial sets and records 1 torch thread, whatever the machine's core count."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs to tell the mask from the machine")
    hpolab = str(Path(sys.executable).with_name("hpolab"))
    out = subprocess.run(["taskset", "-c", "0", hpolab, "--store", str(store), "study", "run", FAULT_SPEC, "n_trials=1",
                          "parallel=1", "trainer.max_epochs=1", "log_models=none"],
                         cwd=FAULT_PROJECT, env=hpolab_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    client, study = open_study(store)
    run = trial_run(study.trials[0], client)
    assert run.data.tags["hpolab.torch_threads"] == "1"

    # reproduce replays a recorded thread count only up to the CPUs available now, and says so
    client.set_tag(run.info.run_id, "hpolab.torch_threads", "64")
    again = subprocess.run(["taskset", "-c", "0", hpolab, "--store", str(store), "reproduce", run.info.run_id],
                           cwd=FAULT_PROJECT, env=hpolab_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "ran with 64 CPU threads; 1 CPU is available here" in again.stdout, again.stdout
    assert "reproduced: identical" in again.stdout
