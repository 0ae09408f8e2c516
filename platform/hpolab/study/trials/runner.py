"""The trial runner: child processes forked from a pre-warmed forkserver, each with a lifeline.

A trial (and the LR range test) runs in a fork of a forkserver that preloaded torch, the training
routine and the experiment: tens of milliseconds to start instead of seconds, and a crash, OOM or
segfault ends that child only. Every child gets two pipes: a duplex one for messages, and a lifeline
whose write end only the driver holds, so the child exits as soon as the driver dies
(see lifeline.py).

While trials train, the runner keeps one standby process: the next trial's process, forked before
its trial is claimed. It imports the experiment and loads the spec's data (when the experiment's
train can preload it: train/builtin.py), then waits; the next start sends it its job instead of
forking. The fork, the process's start and the data leave the time from a claim to its first batch.
It writes nothing until it gets a job, and ends with the driver (its lifeline) or drop_standby().
"""

from __future__ import annotations

import os
import time
from multiprocessing.connection import wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterable

import optuna

from hpolab.study.trials import trial_forkserver
from hpolab.study.trials.gpus import physical_devices, trial_indices
from hpolab.study.trials.host_slots import HostSlots
from hpolab.study.trials.trial_output import TrialOutput
from hpolab.train.cpus import available_cpus, cpu_set


@dataclass(frozen=True)
class Lost:
    """Why a trial this driver runs is no longer its own (driver/heartbeat.py lost_reason), and how.
    `put_back`: a trial scheduler's segment another worker took for dead and put back to paused; Optuna
    keeps it RUNNING and its trial and run go on elsewhere, so nothing ends here. Otherwise another
    worker ended it (reaped: FAIL, with its retry queued there): its run is closed FAIL with `why`."""

    why: str
    put_back: bool = False


@dataclass
class Running:
    """A trial this driver is running: its Optuna trial, MLflow run and child process."""

    trial: optuna.Trial
    run_id: str
    config: dict[str, Any]
    trial_dir: Path
    process: Any = None
    conn: Any = None
    lifeline: Any = None
    started: float = field(default_factory=time.monotonic)
    epoch: int = 0
    last_value: float | None = None
    pruned_at: int | None = None
    last_heartbeat: float = 0.0
    gpu: int | None = None
    uploaded_at: float = field(default_factory=time.monotonic)  # the last checkpoint upload (or the start)
    uploaded_epoch: int = 0  # the epoch of that upload
    best_id: tuple | None = None  # best.pt's identity at that upload (uploaded again only when it is another file)
    lost: Lost | None = None  # another worker took it (heartbeat.py): the driver's loop stops it here
    logged_until: int = 0  # its run has epochs up to this one (a dead segment's, driver/pauses.py): not logged again
    awaits_export: bool = False  # it reported "done" and waits for "export" | "skip" (child_export.py)
    model_tags: dict[str, str] | None = None  # what logging its model put on its run (once logged)
    metric_points: list = field(default_factory=list)  # every metric point given to its run, in order (model links)
    threads: int | None = None  # its torch threads, fixed when it starts (run tag hpolab.torch_threads)
    output: Any = None  # what its process prints (trial_output.TrialOutput)
    prepared: tuple | None = None  # (checkpoint, threads) its process was forked for, until it is told "go" (TrialRunner.prepare)

    @property
    def number(self) -> int:
        return self.trial.number

    def close_pipes(self) -> None:
        """Close its message pipe and lifeline: its process, which has nothing more to hear, exits."""
        close_all(self.conn, self.lifeline)


def close_all(*ends) -> None:
    """Close pipe ends (None: none), whatever state each is in: the process on the other side is gone or going."""
    for c in ends:
        if c is not None:
            try:
                c.close()
            except OSError:
                pass


def spawn_with_lifeline(ctx, target: Callable, name: str, args_for: Callable[[Any, Any], tuple], daemon: bool | None = None):
    """Start `target` in a child of `ctx` with a message pipe and a lifeline.

    `args_for(child_conn, lifeline_read_end)` gives the target's args (the trial and the LR range
    test entry points order them differently). Returns (process, conn, lifeline_write_end): keep the
    write end open for as long as the child should live.
    """
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    life_read, life_write = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=args_for(child_conn, life_read), name=name, daemon=daemon)
    proc.start()
    child_conn.close()
    life_read.close()  # the child holds the read end; we keep the write end alive until it ends
    return proc, parent_conn, life_write


@dataclass
class Standby:
    """A forked trial process without a trial yet (the module doc), and the GPU it was readied for."""

    process: Any
    conn: Any
    lifeline: Any
    output: Any  # the read end of its output pipe
    cuda_device: str | None  # (None: no GPU)


def _sent(conn, message) -> bool:  # (False: the other end is gone)
    try:
        conn.send(message)
        return True
    except OSError:
        return False


def next_message(conn) -> Any | None:
    """The next message a child sent, or None when there is none now (or its pipe is closed)."""
    try:
        if not conn.poll():
            return None
        return conn.recv()
    except (EOFError, OSError):
        return None


def runner_for(spec, project_dir: Path | None) -> "TrialRunner":
    """The runner of a study spec's trials, run from its project folder (default: the working directory)."""
    from hpolab.config.experiment import load_experiment

    ts = spec.trial_scheduler
    exp = load_experiment(spec.experiment)
    scheduler_keys = tuple(ts.mutations) if ts is not None and ts.type == "pbt" else ()
    varies = any(k.startswith("data.") for k in (*spec.search_space, *scheduler_keys))
    config = spec.resolved_config(exp)  # (a standby preloads the spec's data when no trial samples or changes its own)
    preload = None if varies else {"data": config["data"], "data_seed": config["data_seed"]}
    return TrialRunner(spec.experiment, exp.__name__, spec.parallel, (project_dir or Path.cwd()).resolve(),
                       export_models=spec.log_models != "none", pipelined_reports=cannot_stop_early(spec),
                       scheduler_keys=scheduler_keys, preload=preload)


def cannot_stop_early(spec) -> bool:
    """Nothing but the driver's own stop (Ctrl-C, SIGTERM) ends the study's trials early: no pruner
    and no trial scheduler. A trial's reports then do not wait for the driver (reports.py; the routine's never do)."""
    return spec.pruner.type == "none" and spec.trial_scheduler is None


def started_runner(spec) -> "TrialRunner":
    """runner_for(spec) from its project, its forkserver started now (it imports torch and the experiment
    and warms the model export: seconds the CLI spends importing MLflow and opening the stores meanwhile),
    unless `study run` already started it for this spec (trial_forkserver.start_early)."""
    runner = runner_for(spec, spec.project_dir)
    runner.start_forkserver()
    return runner


class TrialRunner:
    """Starts trial processes: the forkserver context, threads per trial and the GPU of each."""

    def __init__(self, experiment: str, experiment_module: str, parallel: int, project_dir: Path, export_models: bool = False,
                 pipelined_reports: bool = False, scheduler_keys: tuple[str, ...] = (), preload: dict[str, Any] | None = None):
        self.experiment = experiment  # the spec's experiment reference, as the child loads it
        self.experiment_module = experiment_module  # the imported module's name, preloaded
        self.parallel = parallel
        self.project_dir = project_dir
        self.export_models = export_models  # the spec logs models: a trial saves its own (child_export.py)
        self.pipelined_reports = pipelined_reports  # a trial's reports need not wait for answers (cannot_stop_early)
        self.scheduler_keys = scheduler_keys  # PBT's mutated keys: a loop must read their changes (config_changes.py)
        self._ctx = None
        self._n_gpus: int | None = None
        self._cpus: int | None = None
        self._retired: list[tuple[Any, int | None]] = []  # (process, gpu) of finished trials still exiting
        self.host_slots = HostSlots(cpu_set(), parallel)  # held while the driver's loop runs trials
        self.outputs: list[TrialOutput] = []  # the trial processes' output pipes still open (trial_output.py)
        self.show_output: Callable[[int, str], None] | None = None  # prints a trial's line on the console
        self.preload = preload  # the data a standby loads ({"data", "data_seed"}; None: none)
        self._standby: Standby | None = None

    def retire(self, r: Running) -> None:
        """A trial that has ended (reported its result, or was killed, or died): its process exits by
        itself (it has nothing left to do, and its lifeline is closed); it is not waited for on the
        driver's loop, only checked without blocking (its GPU counts as used until it is gone)."""
        self.reap_retired()
        if r.process is not None and r.process not in [p for p, _ in self._retired]:
            self._retired.append((r.process, r.gpu))

    def reap_retired(self) -> None:
        """Join and close the retired processes that are gone (their sentinel fds with them): however
        many trials a driver runs, it holds only the processes still exiting."""
        alive = []
        for p, gpu in self._retired:
            if p.is_alive():
                alive.append((p, gpu))
            else:
                p.join()  # (exited: returns at once)
                p.close()
        self._retired = alive

    def context(self):
        if self._ctx is None:
            self.start_forkserver()
        return self._ctx

    def start_forkserver(self) -> None:
        """Start it now (imports torch + the experiment: seconds) so the first trial does not wait;
        a no-op when `study run` started it early for this spec (trial_forkserver.py)."""
        self._ctx = trial_forkserver.start(self.experiment_module, self.export_models)

    def cpus(self) -> int:
        """The CPUs this driver may use: its affinity mask capped by its cgroup's quota (train/cpus.py),
        not the machine's cores (a Slurm task bound to 4 of 64, a container with a 4-CPU quota).
        Read once: it reads cgroup files, and a driver's CPUs do not change while it runs."""
        if self._cpus is None:
            self._cpus = available_cpus()
        return self._cpus

    def threads_per_trial(self) -> int:
        """Torch threads of a trial starting now: the driver's CPUs shared by its `parallel` trials and
        the trial slots of the other drivers on the same CPUs (host_slots.py)."""
        return max(1, self.cpus() // max(self.parallel, self.host_slots.sharing()))

    def gpu_count(self) -> int:
        if self._n_gpus is None:
            try:
                import torch

                # device_count() reads NVML/driver info without creating a CUDA context in the driver.
                self._n_gpus = torch.cuda.device_count()
            except Exception:
                self._n_gpus = 0
        return self._n_gpus

    def least_used_gpu(self, running: Iterable[Running]) -> int | None:
        """The least-used GPU: each running trial gets its own while there are enough."""
        n = self.gpu_count()
        if not n:
            return None
        load = [0] * n
        self.reap_retired()
        for _, gpu in self._retired:
            if gpu is not None:
                load[gpu] += 1
        for other in running:
            if other.gpu is not None:
                load[other.gpu] += 1
        return min(range(n), key=lambda i: load[i])

    def devices_for(self, first: int | None, devices: int = 1) -> str | None:
        """CUDA_VISIBLE_DEVICES for a child using the driver's GPU `first` (and the devices-1 after it),
        mapped through the driver's own CUDA_VISIBLE_DEVICES to physical devices (see gpus.py)."""
        indices = trial_indices(first, devices, self.gpu_count())
        return physical_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), indices)

    def trial_gpus(self, r: Running) -> str | None:
        """CUDA_VISIBLE_DEVICES of a trial: its GPU, or with trainer.devices=N its GPU and the N-1 after it."""
        return self.devices_for(r.gpu, int(r.config["trainer"].get("devices", 1)))

    def prepare(self, r: Running, resume_from: str | None, running: Iterable[Running]) -> None:
        """Fork the process of `r` before its segment starts: it builds its data, model and training
        state (the checkpoint's too) while the driver records the start, and trains only once
        spawn_trial tells it "go" (trial_process.py). Until then it writes nothing: a driver that dies
        meanwhile takes it along (its lifeline), and discard() ends it."""
        self._fork(r, resume_from, running)
        r.prepared = (resume_from, r.threads)

    def spawn_trial(self, r: Running, resume_from: str | None, running: Iterable[Running]) -> None:
        """Start (or restart, after an OOM) the process of `r`: the one prepare() forked for this start,
        else a new one; `running` includes `r` itself."""
        threads = None if r.threads is None else max(1, min(r.threads, self.cpus()))  # (as _fork caps them)
        if r.prepared != (resume_from, threads):  # (none prepared, or its threads changed since: pauses.plan)
            self.discard(r)
            self._fork(r, resume_from, running)
        r.prepared = None
        try:
            r.conn.send("go")
        except OSError:  # it failed already (its set-up): its message and exit say why, on the driver's loop
            pass
        r.started = time.monotonic()

    def discard(self, r: Running) -> None:
        """End the process prepare() forked for `r` and not started (its start did not happen)."""
        if r.prepared is None or r.process is None:
            return
        r.prepared = None
        r.process.kill()
        r.close_pipes()
        self.retire(r)

    def _fork(self, r: Running, resume_from: str | None, running: Iterable[Running]) -> None:
        self.reap_retired()
        r.gpu = None  # (a retry re-picks: do not count its own previous slot)
        r.gpu = self.least_used_gpu(running)
        # (a later segment of a paused trial brings the count its first recorded: capped at the CPUs here)
        r.threads = self.threads_per_trial() if r.threads is None else max(1, min(r.threads, self.cpus()))
        devices = int(r.config["trainer"].get("devices", 1))
        job = {
            "experiment": self.experiment,
            "config": r.config,
            "number": r.number,  # trial.number and trial.params (trial.py)
            "params": dict(r.trial.params),
            "pipelined_reports": self.pipelined_reports,
            "scheduler_keys": list(self.scheduler_keys),
            "checkpoint_dir": str(r.trial_dir),
            "resume_from": resume_from,
            "threads": r.threads,
            "cuda_device": self.trial_gpus(r),
            "project_dir": str(self.project_dir),
            "export_model": self.export_models and devices == 1,  # (DDP trials leave their model to the driver's fallback export)
        }
        # (a trial on several devices forks its ranks from a process that has run no torch yet: not a standby)
        standby = self._take_standby(job["cuda_device"]) if devices == 1 else None
        if standby is not None and not _sent(standby.conn, job):
            self._end(standby)
            standby = None
        if standby is not None:
            r.process, r.conn, r.lifeline, out_read = standby.process, standby.conn, standby.lifeline, standby.output
        else:
            r.process, r.conn, r.lifeline, out_read = self._spawn(f"trial-{r.number}", job)
        r.output = TrialOutput(out_read, r.number, r.trial_dir, self.show_output)
        self.outputs.append(r.output)

    def _spawn(self, name: str, job: dict[str, Any] | None, ready: dict[str, Any] | None = None) -> tuple:
        """Fork a trial process (job None: a standby, `ready` says for what): (process, conn, lifeline, output's read end)."""
        from hpolab.study.trials import trial_entry  # not trial_process: that one imports torch._dynamo (seconds)

        out_read, out_write = self.context().Pipe(duplex=False)  # its stdout and stderr (trial_output.py)
        process, conn, lifeline = spawn_with_lifeline(self.context(), trial_entry.run, name,
                                                      lambda conn, lifeline: (conn, lifeline, job, out_write, ready), daemon=False)
        out_write.close()  # the child holds it now: the pipe ends when the child and its children do
        return process, conn, lifeline, out_read

    def stand_by(self, running: Collection[Running], more: bool = True) -> None:
        """With every slot taken and `more` starts to come: fork the next trial's process now, unless one
        waits already (the module doc). Not with several GPUs: the next trial's is known at its start only."""
        if self._standby is not None or len(running) < self.parallel or not more or self.gpu_count() > 1:
            return
        self.reap_retired()
        cuda_device = self.devices_for(self.least_used_gpu(running))  # (the GPU the next trial would get now)
        ready = {"experiment": self.experiment, "project_dir": str(self.project_dir), "cuda_device": cuda_device,
                 "preload": self.preload, "threads": self.threads_per_trial()}
        self._standby = Standby(*self._spawn("trial-standby", None, ready), cuda_device=cuda_device)

    def _take_standby(self, cuda_device: str | None) -> Standby | None:
        """The standby for a trial on `cuda_device`; None: none, dead, or readied for another GPU (it ends)."""
        standby, self._standby = self._standby, None
        if standby is None:
            return None
        if standby.cuda_device == cuda_device and standby.process.is_alive():
            return standby
        self._end(standby)
        return None

    def drop_standby(self) -> None:
        """End the standby (the driver's loop is over)."""
        if self._standby is not None:
            self._end(self._standby)

    def _end(self, standby: Standby) -> None:
        self._standby = None
        standby.process.kill()
        close_all(standby.conn, standby.lifeline, standby.output)
        self._retired.append((standby.process, None))

    def handles(self, running: Iterable[Running]) -> list:
        """What the driver's loop waits on: the running trials' pipes and processes, and every output still open."""
        running = list(running)
        return [r.conn for r in running] + [r.process.sentinel for r in running] + [o.conn for o in self.outputs if not o.closed]

    def keep_reading_outputs(self) -> None:
        """After the driver's loop: a thread reads the outputs still open until they end (a trial process
        saving its model may print more than its pipe holds)."""
        import threading

        def read() -> None:
            while self.outputs:
                wait([o.conn for o in self.outputs if not o.closed], timeout=1.0)
                self.read_outputs()

        if self.outputs:
            threading.Thread(target=read, name="trial-outputs", daemon=True).start()

    def read_outputs(self) -> None:
        """Take what the trial processes printed (trial_output.py); forget the outputs that ended."""
        for output in self.outputs:
            output.read()
        self.outputs = [o for o in self.outputs if not o.closed]
