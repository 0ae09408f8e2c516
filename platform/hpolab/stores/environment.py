"""What a run ran on: versions, hardware, git state, and the scheduler's job. Recorded as `env.*` tags on every run."""

from __future__ import annotations

import os
import platform as _stdlib_platform  # the standard library module (platform/ is our source root, not a package)
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_state(cwd: str | Path | None = None) -> tuple[str, str]:
    """(commit, dirty) of the working tree, or ("unknown", "unknown") outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return "unknown", "unknown"
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True, text=True, timeout=10)
        return commit.stdout.strip(), str(bool(status.stdout.strip())).lower()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", "unknown"


def capture_environment(cwd: str | Path | None = None, experiment=None) -> dict[str, str]:
    """The env.* tags; with `experiment` (its module), the versions of the packages it imports too
    (experiment_packages.py: env.lightning, env.transformers, env.accelerate, env.scikit-learn ...)."""
    env = _base_environment(cwd)
    if experiment is not None:
        from hpolab.stores.experiment_packages import experiment_packages

        env.update(experiment_packages(experiment, skip={k.removeprefix("env.") for k in env}))
    return env


def _base_environment(cwd: str | Path | None) -> dict[str, str]:
    import torch

    cuda_ok = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda_ok else []
    commit, dirty = git_state(cwd)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "env.python": _stdlib_platform.python_version(),
        "env.platform": _stdlib_platform.platform(),
        "env.torch": torch.__version__,
        "env.torchvision": _version("torchvision"),
        "env.cuda": str(torch.version.cuda) if torch.version.cuda else "none (CPU-only torch)",
        "env.cuda_available": str(cuda_ok).lower(),
        "env.cudnn": str(cudnn) if cudnn else "none",
        "env.gpu": ", ".join(gpus) if gpus else "none",
        "env.gpu_driver": _nvidia_driver() if cuda_ok else "none",
        "env.optuna": _version("optuna"),
        "env.mlflow": _version("mlflow"),
        "env.hpolab": _version("hpolab"),
        "env.numpy": _version("numpy"),
        "env.git_commit": commit,
        "env.git_dirty": dirty,
        "env.hostname": socket.gethostname(),
        "env.executable": sys.executable,
        **scheduler_tags(os.environ),
    }


# The worker's scheduler job, read from the variables Slurm and a Kubernetes Indexed Job set (the k8s
# manifests of `hpolab launch k8s` put the pod and node names in through the downward API).
SCHEDULER_VARS = {
    "SLURM_JOB_ID": "env.slurm_job_id",
    "SLURM_ARRAY_JOB_ID": "env.slurm_array_job_id",
    "SLURM_ARRAY_TASK_ID": "env.slurm_array_task_id",
    "SLURMD_NODENAME": "env.slurm_node",
    "SLURM_RESTART_COUNT": "env.slurm_restart_count",
    "JOB_COMPLETION_INDEX": "env.k8s_job_completion_index",
    "HPOLAB_K8S_POD": "env.k8s_pod",
    "HPOLAB_K8S_NODE": "env.k8s_node",
}


def scheduler_tags(environ) -> dict[str, str]:
    """`env.*` tags naming the scheduler job a worker runs in (none outside one)."""
    return {tag: environ[var] for var, tag in SCHEDULER_VARS.items() if environ.get(var)}


def _nvidia_driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "unknown"
