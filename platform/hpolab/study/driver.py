"""The study driver: Optuna ask/tell around trial processes, MLflow logging, heartbeats.

One driver is one worker; several may join the same study (same spec, shared stores). The driver
is the only writer to the Optuna storage and to MLflow. Each trial runs in its own process forked
from a forkserver that preloaded torch, so a trial costs tens of milliseconds to start and a
crash, OOM or segfault ends that trial only.

Budget: `n_trials` is the study's total of finished trials (COMPLETE + PRUNED + FAIL, not counting
failures that were retried). Re-running the same command continues the study up to that total.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import warnings
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from hpolab.errors import StudyError
from hpolab.config.spec import CategoricalDist, FloatDist, IntDist, StudySpec, load_experiment, spec_to_yaml
from hpolab.stores.optuna_storage import GRACE_PERIOD, HEARTBEAT_INTERVAL, make_storage
from hpolab.stores.paths import Stores, ensure_local
from hpolab.config.samplers import make_pruner, make_sampler
from hpolab.study.progress import Progress
from hpolab.stores import mlflow_runs as tr
from hpolab.stores.environment import capture_environment
from hpolab.stores.models import log_trial_model, warm_exporter

# We call Optuna's heartbeat API from an ask/tell driver on purpose (its built-in heartbeat only
# covers Study.optimize); its "experimental" and "use with optimize" warnings are noise here.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


@dataclass
class Running:
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
    oom_retried: bool = False
    last_heartbeat: float = 0.0
    gpu: int | None = None

    @property
    def number(self) -> int:
        return self.trial.number


@dataclass
class Outcome:
    interrupted: bool = False
    timed_out: bool = False


def optuna_distributions(spec: StudySpec, lr_bounds: tuple[float, float] | None = None) -> dict[str, Any]:
    dists: dict[str, Any] = {}
    for path, d in spec.search_space.items():
        if isinstance(d, FloatDist):
            low, high = (d.low, d.high) if not d.from_lr_range_test else (lr_bounds or (None, None))
            if low is None:
                raise RuntimeError(f"search_space.{path} needs the LR range test result, which is missing")
            dists[path] = FloatDistribution(low, high, log=d.log, step=d.step)
        elif isinstance(d, IntDist):
            dists[path] = IntDistribution(d.low, d.high, log=d.log, step=d.step)
        elif isinstance(d, CategoricalDist):
            dists[path] = CategoricalDistribution(d.choices)
    return dists


def trial_counts(study: optuna.Study) -> dict[str, int]:
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    counts = {"complete": 0, "pruned": 0, "fail": 0, "running": 0, "waiting": 0, "retried": 0}
    for t in trials:
        if t.state == TrialState.FAIL and t.number in retried:
            counts["retried"] += 1
        elif t.state in FINISHED or t.state in (TrialState.RUNNING, TrialState.WAITING):
            counts[t.state.name.lower()] += 1
    counts["finished"] = counts["complete"] + counts["pruned"] + counts["fail"]
    return counts


class Driver:
    def __init__(self, spec: StudySpec, stores: Stores, progress: Progress | None = None, project_dir: Path | None = None, worker_seed: int = 0):
        self.spec = spec
        self.worker_seed = worker_seed  # mixed into the sampler seed so concurrent workers draw differently
        self.stores = stores
        self.progress = progress or Progress(spec, quiet=True)
        self.project_dir = (project_dir or Path.cwd()).resolve()
        self.experiment = load_experiment(spec.experiment)
        self.running: dict[int, Running] = {}
        self.stopping = False  # first Ctrl-C: start nothing new; running trials stop after their epoch
        self.draining = False  # study timeout: start nothing new; running trials finish normally
        self.aborting = False  # second Ctrl-C: stop now
        self.env_tags: dict[str, str] = {}
        self._ctx = None
        self._model_logger = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-logger")
        self._hb_stop = threading.Event()

    # ---------------------------------------------------------------- set-up

    def _open(self) -> None:
        import mlflow

        ensure_local(self.stores)
        # Start the forkserver (imports torch + the experiment, seconds) and warm the model exporter
        # (torch.export, used by mlflow.pytorch.log_model) while we open the stores.
        self._context()
        from multiprocessing import forkserver

        forkserver.ensure_running()
        threading.Thread(target=warm_exporter, daemon=True).start()
        storage = make_storage(self.stores.optuna_url, self.spec.max_retries)
        self._retry_callback = RetryHeartbeatStaleTrialCallback(max_retry=self.spec.max_retries)
        self.storage = storage
        existing = _count_existing_trials(storage, self.spec.name)
        self.study = optuna.create_study(
            storage=storage,
            study_name=self.spec.name,
            sampler=make_sampler(self.spec, seed_offset=existing + self.worker_seed),
            pruner=make_pruner(self.spec),
            direction=self.spec.direction,
            load_if_exists=True,
        )
        if self.study.direction.name.lower() != self.spec.direction:
            raise StudyError(
                f"study {self.spec.name!r} already exists with direction {self.study.direction.name.lower()}; "
                f"the spec says {self.spec.direction}. Use another name, or delete the study."
            )
        mlflow.set_tracking_uri(self.stores.tracking_uri)  # mlflow.pytorch.log_model resolves its client from it
        self.client = tr.client_for(self.stores)
        self.experiment_id = tr.get_or_create_experiment(self.client, self.spec.name, self.stores)
        self.env_tags = capture_environment(self.project_dir)
        self.parent_run_id = self._parent_run()

    def _parent_run(self) -> str:
        run_id = self.study.user_attrs.get("mlflow_parent_run_id")
        if run_id:
            try:
                self.client.get_run(run_id)
                self.client.update_run(run_id, status="RUNNING")
                return run_id
            except Exception:
                run_id = None  # the MLflow store was reset; start a new parent
        run = self.client.create_run(
            self.experiment_id,
            run_name=self.spec.name,
            tags={"optuna.study": self.spec.name, "hpolab.role": "study", **self.env_tags},
        )
        mine = run.info.run_id
        # Workers started together may each have created a parent. All of them pick the same one
        # (the earliest; run id breaks ties) and drop their own empty duplicate.
        live = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`hpolab.role` = 'study' and tags.`optuna.study` = '{self.spec.name}'",
        )
        current = self.study.user_attrs.get("mlflow_parent_run_id")
        chosen = current if current in {r.info.run_id for r in live} else min(
            live, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id
        if chosen != mine:
            self.client.delete_run(mine)
            return chosen
        self.study.set_user_attr("mlflow_parent_run_id", mine)
        tr.log_params(self.client, mine, tr.flatten(self.spec.model_dump(mode="json", exclude={"search_space"})))
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "study.yaml"
            p.write_text(spec_to_yaml(self.spec))
            self.client.log_artifact(mine, str(p))
        return mine

    def _context(self):
        if self._ctx is None:
            ctx = mp.get_context("forkserver")
            # The forkserver imports torch, the routine and the experiment once; every trial is a
            # fork of that warm process (tens of ms) instead of a fresh interpreter (seconds).
            ctx.set_forkserver_preload(["hpolab.study.trial_process", self.experiment.__name__])
            self._ctx = ctx
        return self._ctx

    # ---------------------------------------------------------------- trials

    def _threads_per_trial(self) -> int:
        return max(1, (os.cpu_count() or 1) // self.spec.parallel)

    def _gpu_count(self) -> int:
        if not hasattr(self, "_n_gpus"):
            try:
                import torch

                # device_count() reads NVML/driver info without creating a CUDA context in the driver.
                self._n_gpus = torch.cuda.device_count()
            except Exception:
                self._n_gpus = 0
        return self._n_gpus

    def _cuda_device_for(self) -> int | None:
        """The least-used GPU: each running trial gets its own while there are enough."""
        n = self._gpu_count()
        if not n:
            return None
        load = [0] * n
        for other in self.running.values():
            if other.gpu is not None:
                load[other.gpu] += 1
        return min(range(n), key=lambda i: load[i])

    def _start_trial(self) -> None:
        trial = self.study.ask(fixed_distributions=optuna_distributions(self.spec, self._lr_bounds()))
        self.storage.record_heartbeat(trial._trial_id)
        config = self.spec.resolved_config(self.experiment, trial.params)
        trial_dir = self.stores.trial_dir(self.spec.name, trial.number)
        trial_dir.mkdir(parents=True, exist_ok=True)
        # A retry copy (of a stale or interrupted trial) resumes from the latest dead attempt.
        history = self.study.get_trials(deepcopy=False)[trial.number].system_attrs.get("retry_history") or []
        retry_of = history[-1] if history else None
        # torch's thread count changes float reduction order: recorded so `hpolab reproduce` matches it
        tags = {**self.env_tags, "hpolab.torch_threads": str(self._threads_per_trial()), "hpolab.config.experiment": self.spec.experiment}
        resume_from = None
        if retry_of is not None:
            tags["hpolab.retry_of_trial"] = str(retry_of)
            dead = self.study.get_trials(deepcopy=False)[retry_of]
            if dead.user_attrs.get("mlflow_run_id"):
                tags["hpolab.retry_of_run"] = dead.user_attrs["mlflow_run_id"]
            last = self.stores.trial_dir(self.spec.name, retry_of) / "last.pt"
            if last.exists():
                resume_from = str(last)
                tags["hpolab.resumed_from"] = resume_from
        run_id = tr.start_child_run(self.client, self.experiment_id, self.parent_run_id, self.spec.name, trial.number, tags)
        trial.set_user_attr("mlflow_run_id", run_id)
        tr.log_params(self.client, run_id, tr.flatten(config))
        cfg_path = trial_dir / "config.yaml"
        import yaml

        cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.client.log_artifact(run_id, str(cfg_path))
        r = Running(trial=trial, run_id=run_id, config=config, trial_dir=trial_dir)
        if resume_from:
            self._carry_over_history(r, resume_from)
        self.running[trial.number] = r
        self._spawn(r, resume_from)
        self.progress.trial_started(trial.number, trial.params, retry_of)

    def _carry_over_history(self, r: Running, checkpoint: str) -> None:
        """A retry resumes at epoch k+1; give its trial and run epochs 1..k from the checkpoint, so the
        pruner compares whole learning curves and the run page shows one continuous history."""
        from hpolab.train.checkpoint import load_checkpoint

        try:
            history = load_checkpoint(checkpoint, map_location="cpu").get("history") or []
        except Exception as e:  # the child will report the same problem when it loads it
            self.progress.note(f"trial {r.number}: could not read {checkpoint}: {e}")
            return
        for h in history:
            epoch = int(h["epoch"])
            metrics = {k: v for k, v in h.items() if k != "epoch"}
            tr.log_epoch(self.client, r.run_id, epoch, metrics)
            value = metrics.get(self.spec.metric)
            if value is not None and value == value:
                r.trial.report(value, epoch)
                r.last_value = value
            r.epoch = epoch

    def _spawn(self, r: Running, resume_from: str | None) -> None:
        ctx = self._context()
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        life_keep, life_child = ctx.Pipe(duplex=False)
        r.gpu = None  # (a retry re-picks: do not count its own previous slot)
        r.gpu = self._cuda_device_for()
        job = {
            "experiment": self.spec.experiment,
            "config": r.config,
            "checkpoint_dir": str(r.trial_dir),
            "resume_from": resume_from,
            "threads": self._threads_per_trial(),
            "cuda_device": r.gpu,
            "project_dir": str(self.project_dir),
        }
        from hpolab.study import trial_process

        proc = ctx.Process(target=trial_process.run, args=(child_conn, life_keep, job), name=f"trial-{r.number}", daemon=False)
        proc.start()
        child_conn.close()
        life_keep.close()  # the child holds the read end; we keep the write end alive until the trial ends
        r.process, r.conn, r.lifeline = proc, parent_conn, life_child
        r.started = time.monotonic()

    def _lr_bounds(self) -> tuple[float, float] | None:
        b = self.study.user_attrs.get("lr_range_test")
        return (b["low"], b["high"]) if b else None

    # ---------------------------------------------------------------- events

    def _on_epoch(self, r: Running, epoch: int, metrics: dict[str, float]) -> None:
        r.epoch = epoch
        tr.log_epoch(self.client, r.run_id, epoch, metrics)
        value = metrics.get(self.spec.metric)
        reply = "continue"
        if value is not None and value == value:  # not NaN
            r.last_value = value
            r.trial.report(value, epoch)
            if r.pruned_at is None and r.trial.should_prune():
                r.pruned_at = epoch
        if r.pruned_at is not None or self.stopping:
            reply = "stop"
        r.conn.send(reply)
        self._heartbeat(r, force=True)
        self.progress.epoch(r.number, epoch)

    def _finish(self, r: Running, state: TrialState, tags: dict[str, str], value: float | None = None, model_info: dict | None = None) -> None:
        """Tell Optuna now; close the MLflow run now, or after its model is logged (background)."""
        number = r.number
        self.running.pop(number, None)
        try:
            if state == TrialState.COMPLETE:
                self.study.tell(r.trial, value)
            else:
                self.study.tell(r.trial, state=state)
        except Exception as e:  # never lose the MLflow side because Optuna refused (e.g. already failed as stale)
            tags["hpolab.tell_error"] = f"{type(e).__name__}: {e}"
        for c in (r.conn, r.lifeline):
            try:
                c.close()
            except OSError:
                pass
        if model_info is not None:
            # Exporting + logging a model takes seconds; a single background thread does it so the
            # running trials' epochs (and pruning decisions) never wait behind it.
            self._model_logger.submit(self._log_model_then_close, r, model_info, tags, state)
        else:
            self._close_run(r.run_id, state, tags)
        self.progress.trial_finished(number, state.name, value if value is not None else r.last_value, tags.get("hpolab.fail_reason"), trial_counts(self.study))

    def _close_run(self, run_id: str, state: TrialState, tags: dict[str, str]) -> None:
        mlflow_status = {TrialState.COMPLETE: "FINISHED", TrialState.PRUNED: "KILLED", TrialState.FAIL: "FAILED"}[state]
        tr.set_tags(self.client, run_id, {"hpolab.state": state.name, **tags})
        self.client.set_terminated(run_id, status=mlflow_status)

    def _log_model_then_close(self, r: Running, info: dict[str, Any], tags: dict[str, str], state: TrialState) -> None:
        try:
            tags.update(log_trial_model(self.experiment, r.config, info, r.run_id, self.env_tags))
        except Exception as e:  # the trial's result stands even if the model could not be logged
            tags["hpolab.model_error"] = f"{type(e).__name__}: {e}"
            self.progress.note(f"trial {r.number}: logging the model failed: {e}")
        self._close_run(r.run_id, state, tags)

    def _on_done(self, r: Running, info: dict[str, Any]) -> None:
        tags = {
            "hpolab.best_epoch": str(info["best_epoch"]),
            "hpolab.epochs_run": str(info["epochs_run"]),
            "hpolab.stop_reason": info["stop_reason"],
            "hpolab.amp": info["amp"],
            "hpolab.device": info["device"],
        }
        if info["best_checkpoint"]:
            self.client.log_artifact(r.run_id, info["best_checkpoint"], "checkpoints")
        if r.pruned_at is not None:
            tags["hpolab.pruned_at_epoch"] = str(r.pruned_at)
            self._finish(r, TrialState.PRUNED, tags)
            return
        if info["stop_reason"] == "stopped_by_caller":  # we asked it to stop: Ctrl-C
            tags["hpolab.fail_reason"] = (
                f"interrupted by the user (Ctrl-C) after epoch {info['epochs_run']}; "
                "re-running the study resumes it from its last checkpoint"
            )
            self._finish(r, TrialState.FAIL, tags)
            # Queue a copy with the same params; the next `study run` resumes it from last.pt.
            self._retry_callback(self.study, self.study.get_trials(deepcopy=False)[r.number])
            return
        best = float(info["best_value"])
        tags[f"hpolab.best_{self.spec.metric}"] = repr(best)
        self._finish(r, TrialState.COMPLETE, tags, value=best, model_info=info)

    def _on_fail(self, r: Running, info: dict[str, Any]) -> None:
        if info["kind"] == "oom" and not r.oom_retried:
            self._retry_after_oom(r, info)
            return
        tags = {"hpolab.fail_reason": info["reason"], "hpolab.fail_kind": info["kind"]}
        if info["kind"] == "nan" and r.config["trainer"].get("amp") in ("fp16", "auto"):
            tags["hpolab.fail_hint"] = "non-finite loss; if this ran under fp16 AMP, try trainer.amp=off or bf16, or a lower lr"
        self._log_text(r.run_id, "traceback.txt", info.get("traceback", "") + ("\n" + info["memory_summary"] if info.get("memory_summary") else ""))
        self._finish(r, TrialState.FAIL, tags)

    def _retry_after_oom(self, r: Running, info: dict[str, Any]) -> None:
        t = r.config["trainer"]
        if t["batch_size"] < 2:
            self._on_fail(r, {**info, "reason": info["reason"] + " (micro-batch already 1: cannot halve)"} | {"kind": "oom_final"})
            return
        t["batch_size"] //= 2
        t["grad_accum_steps"] *= 2
        # The retry reproduces the same effective batch with half the memory; the fault injection
        # that caused a test's OOM is cleared so the retry can succeed.
        t["inject_oom_at_step"] = None
        r.oom_retried = True
        tr.set_tags(
            self.client,
            r.run_id,
            {"hpolab.oom_retry": f"retried after CUDA OOM with batch_size={t['batch_size']} grad_accum_steps={t['grad_accum_steps']}"},
        )
        self._log_text(r.run_id, "oom_first_attempt.txt", info.get("traceback", "") + "\n" + info.get("memory_summary", ""))
        for c in (r.conn, r.lifeline):
            c.close()
        r.process.join(timeout=10)
        r.pruned_at, r.epoch = None, 0
        self._spawn(r, resume_from=None)
        self.progress.note(f"trial {r.number}: CUDA OOM, retrying with batch_size={t['batch_size']} x {t['grad_accum_steps']} accumulation")

    def _on_exit_without_result(self, r: Running) -> None:
        code = r.process.exitcode
        if self.aborting:  # we killed it on the second Ctrl-C: resumable, like the first Ctrl-C
            self._finish(r, TrialState.FAIL, {
                "hpolab.fail_reason": f"stopped by a second Ctrl-C during epoch {r.epoch + 1}; re-running the study resumes it from its last checkpoint",
                "hpolab.fail_kind": "interrupted", "hpolab.epochs_run": str(r.epoch)})
            self._retry_callback(self.study, self.study.get_trials(deepcopy=False)[r.number])
            return
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            reason = f"trial process killed by {name}"
            if name == "SIGKILL":
                reason += " (by a user, the per-trial timeout or the kernel's OOM killer: check `dmesg`)"
            elif name == "SIGSEGV":
                reason += " (segmentation fault in native code)"
        else:
            reason = f"trial process exited with code {code} before reporting a result"
        self._finish(r, TrialState.FAIL, {"hpolab.fail_reason": reason, "hpolab.fail_kind": "process", "hpolab.epochs_run": str(r.epoch)})

    def _log_text(self, run_id: str, name: str, text: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / name
            p.write_text(text)
            self.client.log_artifact(run_id, str(p))

    def _heartbeat(self, r: Running, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - r.last_heartbeat >= HEARTBEAT_INTERVAL:
            self.storage.record_heartbeat(r.trial._trial_id)
            r.last_heartbeat = now

    def _heartbeat_loop(self) -> None:
        """Heartbeats from a thread of their own: the main loop can block for seconds (the
        forkserver's first start, a slow store), and a missed beat would make a live trial stale."""
        while not self._hb_stop.wait(HEARTBEAT_INTERVAL):
            for r in list(self.running.values()):
                try:
                    self._heartbeat(r)
                except Exception:
                    pass  # a transient store error; the next beat retries

    # ---------------------------------------------------------------- main loop

    def _handle(self, r: Running) -> None:
        """Drain everything the trial sent, then notice if its process ended."""
        while r.number in self.running:
            try:
                if not r.conn.poll():
                    break
                msg = r.conn.recv()
            except (EOFError, OSError):
                break
            kind = msg[0]
            if kind == "epoch":
                self._on_epoch(r, msg[1], msg[2])
            elif kind == "done":
                r.process.join(timeout=30)
                self._on_done(r, msg[1])
            elif kind == "fail":
                r.process.join(timeout=30)
                self._on_fail(r, msg[1])
        if r.number in self.running and r.process is not None and not r.process.is_alive():
            r.process.join()
            self._on_exit_without_result(r)

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        for r in list(self.running.values()):
            limit = self.spec.trial_timeout
            if limit is not None and now - r.started > limit and r.process.is_alive():
                r.process.kill()
                r.process.join(timeout=10)
                self._finish(r, TrialState.FAIL, {"hpolab.fail_reason": f"trial exceeded trial_timeout ({limit:g} s) and was stopped", "hpolab.fail_kind": "timeout", "hpolab.epochs_run": str(r.epoch)})
            elif self.aborting and r.process.is_alive():
                r.process.kill()

    def _reap_stale_trials(self) -> None:
        """Trials whose driver stopped heartbeating (killed, machine lost) -> FAIL, a WAITING retry
        copy (Optuna's callback), and their MLflow runs closed with the reason, so none stays RUNNING."""
        before = {t.number for t in self.study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING}
        optuna.storages.fail_stale_trials(self.study)
        trials = self.study.get_trials(deepcopy=False)
        for n in before:
            t = trials[n]
            if t.state != TrialState.FAIL or n in self.running:
                continue
            retried_by = [w.number for w in trials if n in w.system_attrs.get("retry_history", []) and w.number != n]
            reason = f"its driver stopped sending heartbeats for {GRACE_PERIOD} s (killed or lost)"
            reason += f"; retried as trial {retried_by[0]}" if retried_by else f"; not retried (max_retries={self.spec.max_retries} reached)"
            run_id = t.user_attrs.get("mlflow_run_id")
            if run_id:
                try:
                    self._close_run(run_id, TrialState.FAIL, {"hpolab.fail_reason": reason, "hpolab.fail_kind": "stale"})
                except Exception as e:
                    self.progress.note(f"could not close the MLflow run of stale trial {n}: {e}")
            self.progress.note(f"trial {n} was stale: {reason}")

    def _install_sigint(self):
        def handler(signum, frame):
            if not self.stopping:
                self.stopping = True
                self.progress.note("Ctrl-C: starting no new trials; running trials stop after their current epoch (Ctrl-C again to stop now)")
            else:
                self.aborting = True
                self.progress.note("Ctrl-C again: stopping now")

        return signal.signal(signal.SIGINT, handler)

    def _ensure_lr_range_test(self) -> None:
        """Run the study's LR range test once (in its own process, like a trial) and record it in
        the study, so a resumed study reuses it instead of re-running it."""
        if not self.spec.lr_range_test.enabled or self.study.user_attrs.get("lr_range_test"):
            return
        from hpolab.study import lr_range as lr_find

        out_dir = lr_find.default_out_dir(self.stores, self.spec)
        ctx = self._context()
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        life_keep, life_child = ctx.Pipe(duplex=False)
        job = lr_find.make_job(self.spec, out_dir, project_dir=self.project_dir, threads=os.cpu_count() or 1,
                               cuda_device=self._cuda_device_for())
        self.progress.note("running the LR range test before the first trial ...")
        proc = ctx.Process(target=lr_find.run_in_process, args=(child_conn, job, life_keep), name="lr-range-test")
        proc.start()
        child_conn.close()
        life_keep.close()
        msg = None
        while msg is None:
            if parent_conn.poll(1.0):
                msg = parent_conn.recv()
            elif not proc.is_alive():
                msg = ("fail", {"reason": f"the LR range test process died (exit code {proc.exitcode})", "traceback": ""})
            elif self.aborting:
                proc.kill()
                raise StudyError("interrupted during the LR range test")
        proc.join(timeout=30)
        life_child.close()
        kind, info = msg
        if kind == "fail":
            raise StudyError(f"the LR range test failed: {info['reason']}")
        result = lr_find.LRRangeResult.from_dict(info["result"])
        run_id = lr_find.log_to_mlflow(self.client, self.experiment_id, self.parent_run_id, result, out_dir, {"optuna.study": self.spec.name})
        self.progress.note(info["summary"])
        attr = lr_find.study_user_attr(result, run_id)
        if attr is None:
            raise StudyError(
                f"the LR range test gave no usable suggestion ({result.warning}); see its plot in {out_dir}. "
                "Give explicit low/high for the search-space entries that use from_lr_range_test."
            )
        self.study.set_user_attr("lr_range_test", attr)
        low, high = attr["low"], attr["high"]
        used = [p for p, d in self.spec.search_space.items() if isinstance(d, FloatDist) and d.from_lr_range_test]
        params = {}
        for p in used:
            params[f"search_space.{p}.low"] = repr(low)
            params[f"search_space.{p}.high"] = repr(high)
        params["lr_range_test.run_id"] = run_id
        params["lr_range_test.bounds_rule"] = "low = suggestion/10, high = min(suggestion*10, divergence LR)"
        tr.log_params(self.client, self.parent_run_id, params)
        self.progress.note(f"search bounds from the LR range test: [{low:.3g}, {high:.3g}] for {', '.join(used) or 'no entry'}")

    def run(self) -> Outcome:
        self._open()
        self._ensure_lr_range_test()
        outcome = Outcome()
        previous = self._install_sigint()
        threading.Thread(target=self._heartbeat_loop, name="heartbeats", daemon=True).start()
        deadline = time.monotonic() + self.spec.timeout if self.spec.timeout else None
        try:
            counts = trial_counts(self.study)
            self.progress.begin(counts, self.stores)
            while True:
                if deadline and time.monotonic() > deadline and not self.draining:
                    outcome.timed_out = True
                    self.draining = True
                    self.progress.note(f"timeout ({self.spec.timeout:g} s) reached: no new trials; running ones finish")
                while not (self.stopping or self.draining) and len(self.running) < self.spec.parallel:
                    self._reap_stale_trials()
                    counts = trial_counts(self.study)
                    if counts["finished"] + counts["running"] + counts["waiting"] >= self.spec.n_trials and counts["waiting"] == 0:
                        break
                    if counts["finished"] >= self.spec.n_trials:
                        break
                    self._start_trial()
                if not self.running:
                    break
                handles = [r.conn for r in self.running.values()] + [r.process.sentinel for r in self.running.values()]
                wait(handles, timeout=1.0)
                for r in list(self.running.values()):
                    self._handle(r)
                self._check_timeouts()
        except BaseException:
            self._abort_all()
            self._model_logger.shutdown(wait=True)
            raise
        finally:
            self._hb_stop.set()
            signal.signal(signal.SIGINT, previous)
        outcome.interrupted = self.stopping
        self._close(outcome)
        return outcome

    def _abort_all(self) -> None:
        for r in list(self.running.values()):
            if r.process is not None and r.process.is_alive():
                r.process.kill()
                r.process.join(timeout=10)
            try:
                self._finish(r, TrialState.FAIL, {"hpolab.fail_reason": "the driver stopped with an error", "hpolab.fail_kind": "driver"})
            except Exception:
                pass

    def _close(self, outcome: Outcome) -> None:
        self._model_logger.shutdown(wait=True)  # every trial's model is logged before the study closes
        counts = trial_counts(self.study)
        tags = {f"hpolab.trials_{k}": str(v) for k, v in counts.items()}
        tags["hpolab.n_trials"] = str(self.spec.n_trials)  # the budget now (a re-run may raise it)
        try:
            best = self.study.best_trial
            tags.update(
                {
                    "hpolab.best_trial": str(best.number),
                    f"hpolab.best_{self.spec.metric}": repr(best.value),
                    "hpolab.best_run_id": best.user_attrs.get("mlflow_run_id", ""),
                }
            )
            self.client.log_metric(self.parent_run_id, f"best_{self.spec.metric}", float(best.value))
        except ValueError:
            pass  # no COMPLETE trial yet
        tr.set_tags(self.client, self.parent_run_id, tags)
        done = counts["finished"] >= self.spec.n_trials
        self.client.set_terminated(self.parent_run_id, status="FINISHED" if done else "KILLED")
        self.progress.end(self.study, counts, self.spec)


def _count_existing_trials(storage: optuna.storages.RDBStorage, name: str) -> int:
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return 0
    return len(storage.get_all_trials(study_id, deepcopy=False))

