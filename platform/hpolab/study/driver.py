"""The study driver: a scheduler of trials around Optuna ask/tell.

One driver is one worker; several may join the same study (same spec, shared stores). The driver
is the only writer to the Optuna storage and to MLflow. It composes small parts:

    budget.py        how many trials the study has; may this worker start another?
    runner.py        trial processes forked from a warm forkserver, each with a lifeline and a GPU
    heartbeat.py     heartbeats of running trials; the reaper of stale ones
    tracker.py       the MLflow run of each trial (parent_run.py: the study's parent run)
    events.py        a trial's messages and exit -> Optuna reports/state + its MLflow run
    lr_step.py       the LR range test, once, before the first trial
    search_space.py  the spec's search space as Optuna distributions

Budget: `n_trials` is the study's total of finished trials (COMPLETE + PRUNED + FAIL, not counting
failures that were retried). Re-running the same command continues the study up to that total.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from hpolab.errors import StudyError
from hpolab.config.spec import StudySpec, load_experiment
from hpolab.stores.budget_lock import budget_lock
from hpolab.stores.optuna_storage import make_storage
from hpolab.stores.paths import Stores, ensure_local
from hpolab.config.samplers import make_pruner, make_sampler
from hpolab.study.progress import Progress
from hpolab.stores import mlflow_runs as tr
from hpolab.stores.environment import capture_environment
from hpolab.stores.models import warm_exporter
from hpolab.study.budget import FINISHED, count_existing_trials, may_start_another, trial_counts
from hpolab.study.heartbeat import Heartbeats, reap_stale_trials
from hpolab.study.lr_step import ensure_lr_range_test, lr_bounds
from hpolab.study.parent_run import close_parent_run, open_parent_run
from hpolab.study.events import TrialEvents
from hpolab.study.runner import Running, TrialRunner
from hpolab.study.search_space import optuna_distributions
from hpolab.study.enqueue import enqueue_known_good
from hpolab.study.spec_guard import check_spec, record_spec
from hpolab.study.stopping import NoImprovementStop
from hpolab.study.tracker import TrialTracker, retry_source

__all__ = ["Driver", "FINISHED", "Outcome", "Running", "optuna_distributions", "trial_counts"]


@dataclass
class Outcome:
    interrupted: bool = False
    timed_out: bool = False


class Driver:
    def __init__(self, spec: StudySpec, stores: Stores, progress: Progress | None = None, project_dir: Path | None = None, worker_seed: int = 0,
                 allow_spec_change: bool = False):
        self.spec = spec
        self.allow_spec_change = allow_spec_change  # accept a changed spec that keeps the search space valid (spec_guard.py)
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
        self.runner = TrialRunner(spec.experiment, self.experiment.__name__, spec.parallel, self.project_dir)

    # ---------------------------------------------------------------- set-up

    def _open(self) -> None:
        import mlflow

        ensure_local(self.stores)
        # Start the forkserver (imports torch + the experiment, seconds) and warm the model exporter
        # (torch.export, used by mlflow.pytorch.log_model) while we open the stores.
        self.runner.start_forkserver()
        threading.Thread(target=warm_exporter, daemon=True).start()
        self.storage = make_storage(self.stores.optuna_url, self.spec.max_retries)
        retry = RetryHeartbeatStaleTrialCallback(max_retry=self.spec.max_retries)
        existing = count_existing_trials(self.storage, self.spec.name)
        self.study = optuna.create_study(
            storage=self.storage,
            study_name=self.spec.name,
            sampler=make_sampler(self.spec, seed_offset=existing + self.worker_seed),
            pruner=make_pruner(self.spec),
            direction=self.spec.direction,
            load_if_exists=True,
        )
        spec_change = check_spec(self.study, self.spec, self.allow_spec_change)  # refused: UserError, nothing written
        if self.study.direction.name.lower() != self.spec.direction:
            raise StudyError(
                f"study {self.spec.name!r} already exists with direction {self.study.direction.name.lower()}; "
                f"the spec says {self.spec.direction}. Use another name, or delete the study."
            )
        mlflow.set_tracking_uri(self.stores.tracking_uri)  # mlflow.pytorch.log_model resolves its client from it
        self.client = tr.client_for(self.stores)
        self.experiment_id = tr.get_or_create_experiment(self.client, self.spec.name, self.stores)
        self.env_tags = capture_environment(self.project_dir)
        self.parent_run_id = open_parent_run(self.client, self.experiment_id, self.study, self.spec, self.env_tags)
        record_spec(self.study, self.client, self.parent_run_id, self.spec, spec_change, self.progress.note)
        self.no_improvement = NoImprovementStop(self.spec, self.study, self.client, self.parent_run_id, self.progress.note)
        self.tracker = TrialTracker(self.client, self.experiment_id, self.parent_run_id, self.spec.name,
                                    self.experiment, self.env_tags, self.progress.note)
        self.events = TrialEvents(self.study, self.storage, self.running, self.tracker, self.runner, self.progress,
                                  self.spec.metric, retry, stopping=lambda: self.stopping, aborting=lambda: self.aborting)
        self.heartbeats = Heartbeats(self.storage, self.running)

    # ---------------------------------------------------------------- trials

    def _start_trial(self, trial: optuna.Trial) -> None:
        config = self.spec.resolved_config(self.experiment, trial.params)
        trial_dir = self.stores.trial_dir(self.spec.name, trial.number)
        trial_dir.mkdir(parents=True, exist_ok=True)
        retry_of, resume_from, retry_tags = retry_source(self.study, self.stores, self.spec.name, trial.number)
        # torch's thread count changes float reduction order: recorded so `hpolab reproduce` matches it
        tags = {**self.env_tags, "hpolab.torch_threads": str(self.runner.threads_per_trial()),
                "hpolab.experiment": self.spec.experiment, **retry_tags}
        run_id = self.tracker.start_run(trial, config, trial_dir, tags)
        r = Running(trial=trial, run_id=run_id, config=config, trial_dir=trial_dir)
        if resume_from:
            self.tracker.carry_over_history(r, resume_from, self.spec.metric)
        self.running[trial.number] = r
        self.runner.spawn_trial(r, resume_from, self.running.values())
        self.progress.trial_started(trial.number, trial.params, retry_of)

    # ---------------------------------------------------------------- main loop

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        for r in list(self.running.values()):
            limit = self.spec.trial_timeout
            if limit is not None and now - r.started > limit and r.process.is_alive():
                r.process.kill()
                r.process.join(timeout=10)
                self.events.finish(r, TrialState.FAIL, {"hpolab.fail_reason": f"trial exceeded trial_timeout ({limit:g} s) and was stopped", "hpolab.fail_kind": "timeout", "hpolab.epochs_run": str(r.epoch)})
            elif self.aborting and r.process.is_alive():
                r.process.kill()

    def _start_trials(self) -> None:
        """Start trials while there are free slots and the budget allows."""
        while not (self.stopping or self.draining) and len(self.running) < self.spec.parallel:
            reap_stale_trials(self.study, self.running, self.spec.max_retries, self.tracker.close_run, self.progress.note)
            trial = self._claim_trial()
            if trial is None:
                break
            self._start_trial(trial)

    def _claim_trial(self) -> optuna.Trial | None:
        """Count and ask under the study's budget lock: with any number of workers, never more than
        n_trials (the asked trial is RUNNING, so the next worker's count includes it)."""
        with budget_lock(self.storage, self.spec.name):
            if not may_start_another(trial_counts(self.study), self.spec.n_trials):
                return None
            trial = self.study.ask(fixed_distributions=optuna_distributions(self.spec, lr_bounds(self.study)))
            self.storage.record_heartbeat(trial._trial_id)
        return trial

    def _install_sigint(self):
        def handler(signum, frame):
            if not self.stopping:
                self.stopping = True
                self.progress.note("Ctrl-C: starting no new trials; running trials stop after their current epoch (Ctrl-C again to stop now)")
            else:
                self.aborting = True
                self.progress.note("Ctrl-C again: stopping now")

        return signal.signal(signal.SIGINT, handler)

    def run(self) -> Outcome:
        self._open()
        ensure_lr_range_test(self.spec, self.study, self.stores, self.runner, self.project_dir, self.client,
                             self.experiment_id, self.parent_run_id, self.progress.note, lambda: self.aborting)
        enqueue_known_good(self.study, self.storage, self.spec, lr_bounds(self.study), self.progress.note)
        outcome = Outcome()
        previous = self._install_sigint()
        self.heartbeats.start()
        deadline = time.monotonic() + self.spec.timeout if self.spec.timeout else None
        try:
            counts = trial_counts(self.study)
            self.progress.begin(counts, self.stores)
            while True:
                if deadline and time.monotonic() > deadline and not self.draining:
                    outcome.timed_out = True
                    self.draining = True
                    self.progress.note(f"timeout ({self.spec.timeout:g} s) reached: no new trials; running ones finish")
                if not self.draining and self.no_improvement.should_stop():
                    self.draining = True  # stop_after_no_improvement: no new trials; running ones finish
                self._start_trials()
                if not self.running:
                    break
                handles = [r.conn for r in self.running.values()] + [r.process.sentinel for r in self.running.values()]
                wait(handles, timeout=1.0)
                for r in list(self.running.values()):
                    self.events.handle(r)
                self._check_timeouts()
        except BaseException:
            self._abort_all()
            self.tracker.shutdown()
            raise
        finally:
            self.heartbeats.stop()
            signal.signal(signal.SIGINT, previous)
        outcome.interrupted = self.stopping
        self._close()
        return outcome

    def _abort_all(self) -> None:
        for r in list(self.running.values()):
            if r.process is not None and r.process.is_alive():
                r.process.kill()
                r.process.join(timeout=10)
            try:
                self.events.finish(r, TrialState.FAIL, {"hpolab.fail_reason": "the driver stopped with an error", "hpolab.fail_kind": "driver"})
            except Exception:
                pass

    def _close(self) -> None:
        self.tracker.shutdown()  # every trial's model is logged before the study closes
        counts = trial_counts(self.study)
        close_parent_run(self.client, self.parent_run_id, self.study, self.spec, counts, self.no_improvement.reason)
        self.progress.end(self.study, counts, self.spec)
