"""`hpolab launch slurm`: one sbatch array job, one `hpolab worker` per array task.

The script `exec`s the worker, so the worker is the batch step's main process: `scancel` (SIGCONT,
then SIGTERM to the job's processes, SIGKILL after the cluster's KillWait, 30 s by default) reaches
it like Ctrl-C reaches `study run` -- no new trials, running ones stop after their epoch and are
resumed by the next launch. Trial processes ignore SIGTERM themselves; their driver ends them.

Stores: URLs without a password are written into the script; a URL holding a password (and MLflow
credentials, from the environment or ./.env) is passed only through sbatch's exported environment, so
it is not stored in the script we keep nor in Slurm's copy of it (`scontrol write batch_script`). The
environment, because that is how Slurm users expect a job to get its settings (`--export=ALL`,
sbatch's default: the job starts with the submitting shell's variables); a file of secrets would have
to sit on a filesystem every node mounts and outlive the job. The script names each variable it needs
(`: "${VAR:?...}"`), so a job submitted without one stops at once saying which, instead of failing
deep inside with HTTP 401; the dry run therefore prints a script that expects them set when submitted.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hpolab.errors import UserError
from hpolab.launch.workers import WorkerCommand, follow_flags, has_secret
from hpolab.stores.paths import Stores, redact

TIME_FORMAT = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")  # sbatch --time: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]


@dataclass(frozen=True)
class SlurmOptions:
    workers: int
    gpus_per_worker: int = 0
    cpus_per_worker: int | None = None
    partition: str | None = None
    time: str | None = None
    requeue: bool = False
    single_node: bool = False
    nodelist: str | None = None
    log_dir: str = "slurm-logs"


def check_options(o: SlurmOptions) -> None:
    if o.workers < 1:
        raise UserError(f"--workers {o.workers}: give 1 or more (one array task per worker)")
    if o.gpus_per_worker < 0:
        raise UserError(f"--gpus-per-worker {o.gpus_per_worker}: give 0 or more")
    if o.cpus_per_worker is not None and o.cpus_per_worker < 1:
        raise UserError(f"--cpus-per-worker {o.cpus_per_worker}: give 1 or more")
    if o.time is not None and not TIME_FORMAT.match(o.time):
        raise UserError(f"--time {o.time!r}: write HH:MM:SS (or D-HH:MM:SS), e.g. --time 04:00:00")


def _directives(name: str, o: SlurmOptions, cwd: Path) -> list[str]:
    d = [f"--job-name=hpolab-{name}", f"--array=0-{o.workers - 1}", "--ntasks=1",
         f"--chdir={cwd}", f"--output={cwd / o.log_dir}/hpolab-{name}-%A_%a.out", "--export=ALL"]
    if o.cpus_per_worker:
        d.append(f"--cpus-per-task={o.cpus_per_worker}")
    if o.gpus_per_worker:
        d.append(f"--gres=gpu:{o.gpus_per_worker}")  # Slurm sets the task's CUDA_VISIBLE_DEVICES; trials map through it
    if o.partition:
        d.append(f"--partition={o.partition}")
    if o.time:
        d.append(f"--time={o.time}")
    d.append("--requeue" if o.requeue else "--no-requeue")
    if o.requeue:
        d.append("--open-mode=append")  # a requeued task appends to its log instead of truncating it
    if o.single_node:
        d.append(f"--nodelist={o.nodelist or socket.gethostname().split('.')[0]}")
    return d


def _store_lines(stores: Stores, credentials: tuple[str, ...]) -> list[str]:
    lines = []
    for var, url in (("OPTUNA_STORAGE", stores.optuna_url), ("MLFLOW_TRACKING_URI", stores.tracking_uri)):
        if has_secret(url):
            lines.append(f': "${{{var}:?{var} holds a password: export it before sbatch (it travels in the job environment, '
                         f'not in this script); it was {redact(url)}}}"')
        else:
            lines.append(f"export {var}={shlex.quote(url)}")
    for var in credentials:  # MLflow's login: its value never enters the script
        lines.append(f': "${{{var}:?{var} (a login to the MLflow server) is not set: export it before sbatch}}"')
    return lines


def render_script(name: str, command: WorkerCommand, stores: Stores, o: SlurmOptions, cwd: Path,
                  credentials: tuple[str, ...] = ()) -> str:
    """The sbatch script (text) for `o.workers` workers of study `name`; `credentials`: the names of
    the MLflow credential variables the jobs must get from their environment."""
    lines = ["#!/bin/bash",
             f"# hpolab launch slurm: {o.workers} worker(s) of study {name}, one per array task.",
             f"# Follow: squeue -j JOBID; sacct -j JOBID; hpolab{follow_flags(stores, cwd)[0]} study status {shlex.quote(name)}",
             *[f"#SBATCH {d}" for d in _directives(name, o, cwd)],
             "set -euo pipefail",
             *_store_lines(stores, credentials),
             "export PYTHONUNBUFFERED=1  # the log shows progress as it happens",
             "# exec: the worker replaces this shell, so scancel's SIGTERM reaches it (a graceful stop:",
             "# running trials end as interrupted and resume on the next launch).",
             f"exec {command.shell()}"]
    return "\n".join(lines) + "\n"


def submit(script: str, name: str, stores: Stores, o: SlurmOptions, cwd: Path, credentials: dict[str, str]) -> str:
    """Write the script under the log folder and submit it with `sbatch --parsable`: the job id. The
    stores' URLs and `credentials` (MLflow's login) go in sbatch's environment, which the job gets."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise UserError("sbatch not found on PATH: run this on a Slurm login/submit node (for a local test "
                        "cluster: sudo scripts/slurm-local start), or use --dry-run to print the script")
    log_dir = cwd / o.log_dir
    log_dir.mkdir(parents=True, exist_ok=True)  # sbatch does not create the --output folder
    path = log_dir / f"hpolab-{name}.sbatch"
    path.write_text(script)
    env = dict(os.environ, OPTUNA_STORAGE=stores.optuna_url, MLFLOW_TRACKING_URI=stores.tracking_uri)
    env.update(credentials)
    done = subprocess.run([sbatch, "--parsable", str(path)], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise UserError(f"sbatch refused the job ({path}): {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]  # "JOBID" or "JOBID;CLUSTER"


def follow_text(job_id: str, name: str, o: SlurmOptions, cwd: Path, store_flags: str, notes: list[str]) -> str:
    logs = cwd / o.log_dir / f"hpolab-{name}-{job_id}_*.out"
    return "\n".join([
        f"submitted Slurm job {job_id}: {o.workers} worker(s) of study {name} (array 0-{o.workers - 1})",
        "follow it:",
        f"  squeue -j {job_id}",
        f"  sacct -j {job_id} --format=JobID,State,ExitCode,NodeList",
        f"  tail -f {logs}",
        f"  hpolab{store_flags} study status {shlex.quote(name)}",
        *[f"    ({n}: set it as the jobs got it{', e.g. set -a; . ./.env; set +a' if (cwd / '.env').is_file() else ''})" for n in notes],
        f"stop it: scancel {job_id}  (trials end as interrupted; launch again to continue the study)",
    ])
