"""The study driver: a scheduler of trials around Optuna ask/tell.

One driver is one worker; several may join the same study (same spec, shared stores). The driver
is the only writer to the Optuna storage and to MLflow. It composes small parts:

    budget.py        how many trials the study has; may this worker start another?
    runner.py        trial processes forked from a warm forkserver, each with a lifeline and a GPU
    heartbeat.py     heartbeats of running trials; the reaper of stale ones
    tracker.py       the MLflow run of each trial (parent_run.py: the study's parent run)
    uploads.py       one background thread: checkpoint uploads, models, run closes (submit never blocks)
    retention.py     log_models / keep_checkpoints: which finished trials keep models and checkpoints
    events.py        a trial's messages and exit -> Optuna reports/state + its MLflow run
    lr_step.py       the LR range test, once, before the first trial
    search_space.py  the spec's search space as Optuna distributions

    owners.py        who owns a RUNNING trial (host, pid, start time): dead owners are seen at once
    retry.py         retry copies: a failed attempt continues as a new trial from its checkpoint
    signals.py       Ctrl-C / SIGTERM: graceful first, immediate second
    repair.py        MLflow runs a killed driver left open
    outage.py        a database store briefly unreachable: the loop's store calls retried (storage_outage_grace)
    control.py       study pause|resume|stop|set, read each loop turn; notify.py: the spec's notifications
    system_metrics.py  each trial's processes sampled into its run's system/ metrics

Budget: `n_trials` is the study's total of finished trials (COMPLETE + PRUNED + FAIL, not counting
failures that were retried). Re-running the same command continues the study up to that total.
A driver does not leave while other drivers' trials are RUNNING (unless it was interrupted): it
waits for them to finish, or retries them once they are dead, so the budget is really spent.

Sampler seed: `seed` (or the user's own `sampler.kwargs.seed`) + the number of trials the study
already has (a re-run draws new points) + a worker salt. The salt is 0 for `hpolab study run` while no
other driver is running trials of the study, so a single driver on a study is reproducible for a
given seed; `hpolab worker`, and a driver joining a study with a live owner, salt with host, pid,
start time and random bits (seeds.py), so workers in containers (all PID 1) or on several hosts draw
different points. The salt and the sampler seed are tags of every trial run (`hpolab.worker_seed`,
`hpolab.sampler_seed`) and the trial's user attr `worker_seed`.
"""

from __future__ import annotations

import time
from multiprocessing.connection import wait
from pathlib import Path

import optuna
from optuna.trial import TrialState

from hpolab.errors import StudyError
from hpolab.config.spec import StudySpec, load_experiment
from hpolab.config.training_loop import recorded_config
from hpolab.config.experiment_code import code_of
from hpolab.stores.optuna_storage import make_storage
from hpolab.stores.paths import Stores, ensure_local
from hpolab.config.samplers import make_pruner, make_sampler, sampler_seed
from hpolab.study.sampling import warm_start
from hpolab.study.objectives.pruning import Pruning
from hpolab.study.objectives.ranking import directions_of
from hpolab.study.driver.progress import Progress
from hpolab.stores import mlflow_runs as tr
from hpolab.stores.environment import capture_environment
from hpolab.stores.trial_states import OWNED, state_of
from hpolab.study.state import lifecycle
from hpolab.study.state.budget import FINISHED, FailureStreak, count_existing_trials, epoch_budget_spent, may_start_another, trial_counts
from hpolab.study.driver.heartbeat import AttrBeats, Heartbeats, others_running, reap_dead_trials
from hpolab.study.lr_test.lr_step import ensure_lr_range_test, lr_bounds
from hpolab.study.state.outage import StorageOutage
from hpolab.study.state.owners import owner_gone, owner_of
from hpolab.study.driver.parent_run import close_parent_run, fail_parent_run, open_parent_run
from hpolab.study.driver.claiming import claim, give_back
from hpolab.study.driver.events import TrialEvents
from hpolab.study.driver.control import StudyControl
from hpolab.study.driver.notify import Notifier
from hpolab.study.driver.outcome import Outcome
from hpolab.study.driver.pauses import Claimed, Pauses
from hpolab.study.objectives.schedulers import scheduler_for
from hpolab.study.state.metric_backfill import closing_with_backfill
from hpolab.study.state.repair import close_orphan_runs
from hpolab.study.retention.retention import Retention
from hpolab.study.state.retry import RetryCopy
from hpolab.study.sampling.seeds import worker_salt
from hpolab.study.trials.runner import Running, TrialRunner, runner_for
from hpolab.study.sampling.search_space import optuna_distributions
from hpolab.study.driver.signals import StopSignals
from hpolab.study.sampling.enqueue import enqueue_known_good
from hpolab.study.sampling.seed_trials import seed_trial_tags, trial_config
from hpolab.study.driver.spec_guard import check_spec, record_spec
from hpolab.study.driver.code_guard import check_code, record_code
from hpolab.study.sampling.noise_probe import NoiseProbe
from hpolab.study.objectives.stopping import NoImprovementStop
from hpolab.study.trials.tracker import TrialTracker, retry_source
from hpolab.study.trials.system_metrics import SystemMetrics

__all__ = ["Driver", "FINISHED", "Outcome", "Running", "optuna_distributions", "trial_counts"]


class Driver:
    def __init__(self, spec: StudySpec, stores: Stores, progress: Progress | None = None, project_dir: Path | None = None, worker_seed: int = 0,
                 allow_spec_change: bool = False, allow_code_change: bool = False, runner: TrialRunner | None = None):
        self.spec = spec
        self.allow_spec_change = allow_spec_change  # accept a changed spec that keeps the search space valid (spec_guard.py)
        self.worker_seed = worker_seed  # the salt mixed into the sampler seed so concurrent workers draw differently
        self.sampler_seed: int | None = None
        self.stores = stores
        self.progress = progress or Progress(spec, quiet=True)
        self.project_dir = (project_dir or Path.cwd()).resolve()
        self.experiment = load_experiment(spec.experiment)
        self.code = code_of(self.experiment, spec.experiment)  # recorded on the study and every trial run (code_guard.py)
        self.allow_code_change = allow_code_change
        self.running: dict[int, Running] = {}
        self.signals = StopSignals(self.progress.note)  # first Ctrl-C/SIGTERM: graceful; second: now
        self.draining = False  # study timeout or failure limit: start nothing new; running trials finish
        self.streak = FailureStreak(spec.max_failures)
        self.retry = RetryCopy(spec.max_retries, spec.max_interrupts)
        self.parent_run_id: str | None = None
        self.env_tags: dict[str, str] = {}
        self.runner = runner or runner_for(spec, self.project_dir)  # (the CLI starts its forkserver early)
        self.runner.show_output = self.progress.trial_line  # what trials print: `trial N | line` (trial_output.py)
        self._waiting_note, self.more_to_start = 0.0, True  # (more_to_start: claiming.py's hint; False: no standby forked)
        self._dead_claimed: list = []  # claimed trials of dead drivers (no run made): taken over in place (lifecycle.reclaim)
        # The loop's store calls ride out a database restart (outage.py): one per store, each says its name.
        aborting = lambda: self.signals.aborting  # noqa: E731
        self.outage = StorageOutage(spec.storage_outage_grace, "storage", aborting)
        self.mlflow_outage = StorageOutage(spec.storage_outage_grace, "MLflow tracking store", aborting)
        self.beat_watch = AttrBeats()  # other drivers' heartbeats through the gRPC proxy (heartbeat.py)

    # ---------------------------------------------------------------- set-up

    def _seed_offset(self) -> int:
        existing = count_existing_trials(self.storage, self.spec.name)
        try:
            study_id = self.storage.get_study_id_from_name(self.spec.name)
            running = self.storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
            busy = any(owner_gone(owner_of(t)) is None and state_of(t) in OWNED for t in running)  # (a paused trial has no driver)
        except KeyError:
            busy = False
        # Another driver is running trials now: salt, or both would propose the same points.
        if busy and not self.worker_seed:
            self.worker_seed = worker_salt()
        self.sampler_seed = sampler_seed(self.spec, existing + self.worker_seed)
        return existing + self.worker_seed

    def _open(self) -> None:
        import mlflow

        ensure_local(self.stores)
        # Start the forkserver (imports torch + the experiment, and warms the model export when the
        # spec logs models: seconds) while we open the stores; the CLI has started it already.
        self.runner.start_forkserver()
        self.storage = make_storage(self.stores, self.spec.max_retries)
        self.storage.heartbeat_stale_trial_callback = self.retry  # (if anything calls fail_stale_trials)
        directions = [o.direction for o in self.spec.objective_list]
        source = warm_start.check_source(self.storage, self.spec)  # refused before the study exists
        self.study = optuna.create_study(
            storage=self.storage, study_name=self.spec.name, sampler=make_sampler(self.spec, seed_offset=self._seed_offset()),
            pruner=make_pruner(self.spec), directions=directions, load_if_exists=True)
        spec_change = check_spec(self.study, self.spec, self.allow_spec_change)  # refused: UserError, nothing written
        code_change = check_code(self.study, self.code, self.allow_code_change)  # likewise
        if directions_of(self.study) != directions:
            raise StudyError(
                f"study {self.spec.name!r} already exists with direction {', '.join(directions_of(self.study))}; "
                f"the spec says {', '.join(directions)}. Use another name, or delete the study."
            )
        if self.spec.is_multi_objective and self.study.metric_names is None:
            self.outage.call(self.study.set_metric_names, [o.metric for o in self.spec.objective_list])
        self.pruning = Pruning(self.spec, self.storage, self.outage.call)
        if source is not None:
            done = warm_start.apply(self.study, self.storage, self.spec, source, lr_bounds(self.study))
            if done:
                self.progress.note(done)
        mlflow.set_tracking_uri(self.stores.tracking_uri)  # mlflow.pytorch.log_model resolves its client from it
        self.client = tr.client_for(self.stores)
        self.experiment_id = tr.get_or_create_experiment(self.client, tr.experiment_of(self.study), self.stores)
        self.env_tags = capture_environment(self.project_dir, self.experiment)  # (its packages' versions too)
        self.parent_run_id = open_parent_run(self.client, self.experiment_id, self.study, self.spec, self.env_tags)
        record_spec(self.study, self.client, self.parent_run_id, self.spec, spec_change, self.progress.note)
        record_code(self.study, self.client, self.parent_run_id, self.code, code_change, self.progress.note)
        if self.study.user_attrs.get(warm_start.DONE_ATTR):
            tr.set_tags(self.client, self.parent_run_id, {warm_start.DONE_ATTR: self.study.user_attrs[warm_start.DONE_ATTR]})
        self.outage.call(self.study.set_user_attr, "hpolab.budget_epochs", self.spec.budget.epochs)  # (`study status` shows it)
        self.outage.call(self.study.set_user_attr, "hpolab.promotion", self.spec.promotion.model_dump())  # (promote's race defaults)
        self.no_improvement = NoImprovementStop(self.spec, self.study, self.client, self.parent_run_id, self.progress.note)
        self.probe = NoiseProbe(self.spec, self.study, self.storage, self.progress.note)  # (noise_probe: the incumbent on new seeds)
        retention = Retention(self.spec, self.study, lambda n: self.stores.trial_dir(self.spec.name, n))
        self.tracker = TrialTracker(self.client, self.experiment_id, self.parent_run_id, self.spec.name,
                                    self.experiment, self.env_tags, self.progress.note, retention,
                                    self.spec.checkpoint_upload_every, guard=self.outage.call,
                                    mlflow_guard=self.mlflow_outage.call, code=self.code)
        self.system_metrics = SystemMetrics(self.spec.system_metrics, self.tracker)  # each trial's processes, in its run
        scheduler = scheduler_for(self.spec, self.stores)  # ASHA / PBT: pause and resume trials (pauses.py)
        self.pauses = scheduler and Pauses(scheduler, self.spec, self.stores, self.study, self.storage, self.running, self.tracker, self.progress,
                                           self.outage.call, may_resume=lambda: not (self.signals.stopping or self.draining or self.control.paused))
        self.events = TrialEvents(self.study, self.storage, self.running, self.tracker, self.runner, self.progress,
                                  self.spec.metric, self.retry, self.streak,
                                  stopping=lambda: self.signals.stopping, aborting=lambda: self.signals.aborting,
                                  guard=self.outage.call, spec=self.spec, pruning=self.pruning, pauses=self.pauses)
        self.heartbeats = Heartbeats(self.storage, self.running)
        close_orphan_runs(self.client, self.experiment_id, self.study, self.tracker.close_run, self.progress.note,
                          stores=self.stores)
        self.control = StudyControl(self)  # study pause/resume/stop/set (control.py): applied as found, then each loop turn
        self.notify = Notifier(self.spec, self.stores, self.storage, self.study._study_id, self.progress.note, self.experiment_id, self.client)
        self.progress.listeners.append(self.notify.trial_finished)  # (the spec's notify: trial_failed, new_best)

    # ---------------------------------------------------------------- trials

    def _start_trial(self, trial: optuna.Trial) -> None:
        g = self.outage.call
        src = g(retry_source, self.study, self.stores, self.spec.name, trial.number)
        config = trial_config(self.spec, self.experiment, trial)  # (a seed trial: its own config and training seed)
        config["trainer"].update(src.overrides)  # e.g. the halved micro-batch after a CUDA OOM
        if self.pauses:
            self.pauses.adjust(config, trial.user_attrs)
        trial_dir = self.stores.trial_dir(self.spec.name, trial.number)
        trial_dir.mkdir(parents=True, exist_ok=True)
        # torch's thread count changes float reduction order: recorded so `hpolab reproduce` matches it
        threads = self.runner.threads_per_trial()
        tags = {**self.env_tags, "hpolab.torch_threads": str(threads),
                "hpolab.experiment": self.spec.experiment, "hpolab.worker_seed": str(self.worker_seed),
                "hpolab.sampler_seed": str(self.sampler_seed), **seed_trial_tags(trial), **src.tags}
        if trial.user_attrs.get("hpolab.warm_start_from"):  # an earlier study's configuration, re-run here
            tags["hpolab.warm_start_from"] = trial.user_attrs["hpolab.warm_start_from"]
        g(trial.set_user_attr, "worker_seed", self.worker_seed)
        r = Running(trial=trial, run_id="", config=config, trial_dir=trial_dir, threads=threads)
        # Its process builds its data and model while the run is made; it trains once its segment starts.
        self.runner.prepare(r, src.resume_from, [*self.running.values(), r])
        try:
            r.run_id = self.tracker.start_run(trial, config, trial_dir, tags, recorded_config(self.spec, config, self.experiment))
            if src.resume_from:
                self.tracker.carry_over_history(r, src.resume_from, self.spec.metric, self.pruning.report)
            if self.pauses:
                self.pauses.plan(r)  # where this segment pauses (a retry copy: at the same place as its attempt)
            self.running[trial.number] = r
            if self.pauses:
                self.pauses.spawn(r, self.runner, src.resume_from)
            else:
                lifecycle.segment_started(lambda: self.runner.spawn_trial(r, src.resume_from, self.running.values()))
        finally:
            self.runner.discard(r)  # (a start that did not happen: its prepared process ends; a no-op once started)
        self.progress.trial_started(trial.number, trial.params or seed_trial_tags(trial), src.retry_of)

    def reap(self) -> None:
        """Dead drivers' trials reaped (or paused again) and owed retry copies queued, outside the budget
        lock (a reap restores and closes runs in MLflow); dead drivers' claimed trials kept for the claim."""
        close = self.notify.watch_reaps(closing_with_backfill(self.tracker.close_run_if_open, self.client, self.study, self.stores,
                                                              self.progress.note))  # (worker_lost)
        # One read of every trial for both (each read fetches every unfinished trial, a paused one too):
        # a trial reaped here queues its own retry copy, so the read from before the reap serves the owed ones.
        trials = self.study.get_trials(deepcopy=False)
        self._dead_claimed = reap_dead_trials(self.study, self.storage, self.running, self.retry, close, self.progress.note,
                                              self.outage.call, self.beat_watch, self.pauses.put_back if self.pauses else None,
                                              trials=trials)
        self.pruning.close_orphans(self.study)  # several objectives: a dead driver's companion trials
        lifecycle.owed_retries(self.study, trials, self.retry, self.outage.call)

    def _start_trials(self) -> None:
        """Start trials while there are free slots and the budget allows."""
        while not (self.signals.stopping or self.draining or self.control.paused) and len(self.running) < self.spec.parallel:
            trial = self.outage.call(self._claim_trial)  # before ask(): all again; after it, its own writes are retried
            if trial is None:
                break
            if self.signals.stopping:  # a stop signal while it was claimed: not started (a re-run takes it)
                give_back(self, trial)
                break
            if isinstance(trial, Claimed):  # a paused trial resumes
                self.pauses.start(trial, self.experiment, self.runner)
            else:
                self._start_trial(trial)
            self.runner.stand_by(self.running.values(), more=self.more_to_start and not (self.signals.stopping or self.draining))

    def _claim_trial(self) -> optuna.Trial | Claimed | None:
        return claim(self)

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        limit = self.spec.trial_timeout
        for r in list(self.running.values()):
            if limit is not None and now - r.started > limit and r.process.is_alive():
                self.events.on_timeout(r, limit)
            elif self.signals.aborting and r.process.is_alive():
                r.process.kill()

    def _others_still_running(self) -> bool:
        """With nothing of its own to run: are other drivers' trials RUNNING (wait for them, or
        retry them once they are dead)? Dead ones are reaped here and become WAITING copies."""
        if self.signals.stopping or self.draining:
            return False
        g = self.outage.call
        g(self.reap)
        others = g(others_running, self.study, self.storage, self.running, self.beat_watch)
        if others and time.monotonic() - self._waiting_note > 30:
            self._waiting_note = time.monotonic()
            self.progress.note("waiting for trials of other drivers: " + "; ".join(others))
        if others:
            time.sleep(1.0)
        counts = g(trial_counts, self.study)
        return bool(others) or (counts["waiting"] > 0 and may_start_another(counts, self.spec.n_trials))

    # ---------------------------------------------------------------- main loop

    def run(self) -> Outcome:
        self.signals.install()  # first, so a Ctrl-C/SIGTERM during set-up or the LR range test is graceful
        self.runner.host_slots.hold()  # from the start: drivers started together count each other's first trials
        try:
            self._open()
            ensure_lr_range_test(self.spec, self.study, self.stores, self.runner, self.project_dir, self.client,
                                 self.experiment_id, self.parent_run_id, self.progress.note, lambda: self.signals.aborting)
            if not self.signals.stopping:  # interrupted during the LR range test: no bounds yet, no trials to queue
                enqueue_known_good(self.study, self.storage, self.spec, lr_bounds(self.study), self.progress.note)
            outcome = self._loop()
            self._close(outcome)
            return outcome
        except BaseException as e:
            self._on_error(e)
            raise
        finally:
            self.runner.drop_standby()
            self.runner.host_slots.release()
            self.signals.restore()

    def _on_error(self, e: BaseException) -> None:
        """The driver failed: its trials end (resumable), and the parent run does not stay RUNNING."""
        self.outage.gave_up = self.mlflow_outage.gave_up = True  # ending: no store call waits out an outage now
        if hasattr(self, "events"):
            self._abort_all()
            self.tracker.shutdown()
        if self.parent_run_id:
            try:
                fail_parent_run(self.client, self.parent_run_id, f"{type(e).__name__}: {e}")
            except Exception:
                pass
        if hasattr(self, "notify"):
            self.notify.driver_failed(e)  # study_error (not for Ctrl-C), then a short wait for the deliveries

    def _loop(self) -> Outcome:
        outcome = Outcome(n_trials=self.spec.n_trials)
        self.heartbeats.start()
        started = time.monotonic()
        try:
            self.progress.begin(self.outage.call(trial_counts, self.study), self.stores)
            while True:
                if self.spec.timeout and time.monotonic() - started > self.spec.timeout and not self.draining:  # (`study set` may change it)
                    outcome.timed_out = self.draining = True
                    self.progress.note(f"timeout ({self.spec.timeout:g} s) reached: no new trials; running ones finish")
                if self.streak.hit and not self.draining:
                    self.draining = True
                    outcome.failure_limit = self.streak.why()  # (max_failures in a row, or a broken own-loop contract)
                    self.progress.note(f"stopping: {outcome.failure_limit}; running trials finish")
                if not self.draining and self.outage.call(self.no_improvement.should_stop):
                    self.draining = True  # stop_after_no_improvement: no new trials; running ones finish
                    outcome.stopped = self.no_improvement.reason
                if self.control.hold():  # paused with nothing running here: wait for resume, a stop or a signal
                    continue
                self.outage.call(self.probe.step)
                self._start_trials()
                self.runner.host_slots.running(len(self.running))  # (what other drivers here count)
                if not self.running:
                    if self._others_still_running():
                        continue
                    if self.pauses and not self.signals.stopping and not self.outage.call(self.pauses.end_paused, self.draining):
                        continue  # a paused trial can resume now
                    break
                wait(self.runner.handles(self.running.values()), timeout=1.0)
                self.system_metrics.sample(self.running.values())  # (when due; before a finished one leaves)
                self.runner.read_outputs()  # (before the messages: a failure's last lines are in)
                for r in list(self.running.values()):
                    self.events.handle(r)
                self.runner.host_slots.running(len(self.running))
                self._check_timeouts()
        finally:
            self.heartbeats.stop()
        outcome.signal = self.signals.signum
        return outcome

    def _abort_all(self) -> None:
        for r in list(self.running.values()):
            if r.process is not None and r.process.is_alive():
                r.process.kill()
                r.process.join(timeout=10)
            try:
                self.events.finish(r, TrialState.FAIL, {"hpolab.fail_reason": "the driver stopped with an error", "hpolab.fail_kind": "driver"},
                                   retry="driver")
            except Exception:
                pass

    def _close(self, outcome: Outcome) -> None:
        self.runner.keep_reading_outputs()  # (a trial process saving its model may still print)
        self.tracker.shutdown()  # every trial's model is logged before the study closes
        # Again at the end: a driver killed between making a trial's run and linking it leaves that run
        # RUNNING; at _open its trial was often still RUNNING (not yet reaped), so it was skipped there.
        self.mlflow_outage.call(close_orphan_runs, self.client, self.experiment_id, self.study, self.tracker.close_run,
                                self.progress.note, stores=self.stores)
        g = self.outage.call
        outcome.counts = g(trial_counts, self.study)
        outcome.n_trials, outcome.halted = self.spec.n_trials, self.control.halted  # (as `study set` / `study stop` left them)
        if outcome.signal is None and g(epoch_budget_spent, self.study.get_trials(deepcopy=False), self.spec):
            outcome.budget_spent = True  # the study ended as planned
            outcome.stopped = outcome.stopped or f"budget.epochs ({self.spec.budget.epochs}) used"
        g(close_parent_run, self.client, self.parent_run_id, self.study, self.spec, outcome.counts, self.no_improvement.reason)
        g(self.progress.end, self.study, outcome.counts, self.spec)
        self.notify.ended(outcome)  # study_finished or study_error; waits a little for the deliveries
