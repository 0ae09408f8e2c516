"""What a trial's messages mean: reports to Optuna and MLflow, and the end of the trial.

    ("epoch", n, m)  -> metrics logged, value reported to the pruner; "continue" or "stop" back
    ("done", info)   -> COMPLETE (model logged), PRUNED (the pruner said stop) or, when the driver
                        asked it to stop (Ctrl-C, SIGTERM) before its last epoch, FAIL with a
                        retry copy that resumes it
    ("fail", info)   -> FAIL; a CUDA OOM is retried as a new attempt (retry copy) with half the
                        micro-batch and twice the accumulation, resuming from its last checkpoint
    exit, no message -> FAIL with the signal or exit code explained (also when it died while the
                        driver answered its epoch: a dead child's pipe ends its trial only); the pipe
                        is drained once more after the exit is seen (its result may have come last)
    lost             -> another worker reaped it (Optuna has it FAIL, its retry queued there): the
                        child is stopped, its run closed FAIL with why, no model, no second retry

Optuna's state is the truth MLflow records: after every tell the trial is read back, and a tell that
failed, or that Optuna recorded otherwise, closes the run with Optuna's state (FAIL when it cannot be
read), never COMPLETE with a model. A COMPLETE whose study metric was never finite is a FAIL.
Every retry is a new Optuna trial and MLflow run (retry.py) that carries the epochs over.

Store calls go through `guard` (outage.py: retried while the database is unreachable). A tell that
reached the database but whose reply was lost in the outage is not told twice: the retry skips a
trial that is already finished, and the state read back decides, as always.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpolab.study.state.budget import NOT_THE_TRIALS_FAULT, FailureStreak, trial_counts
from hpolab.errors import StudyError
from hpolab.study.objectives import objective_values
from hpolab.study.driver.heartbeat import beat, lost_reason
from hpolab.study.state import lifecycle
from hpolab.study.state.outage import passthrough
from hpolab.study.driver.progress import Progress
from hpolab.study.objectives import ranking
from hpolab.study.objectives.pruning import Pruning
from hpolab.stores.model_links import points_at
from hpolab.study.state.retry import RetryCopy
from hpolab.study.trials.runner import Lost, Running, TrialRunner, next_message
from hpolab.study.trials.tracker import TrialTracker
from hpolab.study.trials.trial_output import FAILURE_ATTR
from hpolab.study.driver.end_reasons import metrics_source, disagreement, exit_reason


class TrialEvents:
    """Handles the messages and exits of the driver's running trials."""

    def __init__(self, study: optuna.Study, storage, running: dict[int, Running], tracker: TrialTracker, runner: TrialRunner,
                 progress: Progress, metric: str, retry: RetryCopy, streak: FailureStreak,
                 stopping: Callable[[], bool], aborting: Callable[[], bool], guard: Callable[..., Any] = passthrough,
                 spec=None, pruning: Pruning | None = None, pauses=None):
        self.study = study
        self.storage = storage  # for the heartbeat after every epoch
        self.running = running  # the driver's own dict: a finished trial leaves it here
        self.tracker = tracker
        self.runner = runner
        self.progress = progress
        self.metric = metric
        self.spec = spec  # its objectives and constraints (objective_values.py); None: the metric alone
        self.pruning = pruning or Pruning()  # one objective: the trial itself; several: a companion study
        self.never_prunes = spec is not None and spec.pruner.type == "none"  # (Optuna's NopPruner)
        # several objectives: where the pruning metric is among the values told
        self._primary = [o.metric for o in spec.objective_list].index(metric) if spec is not None and spec.is_multi_objective else 0
        self.retry = retry  # queues a WAITING copy that resumes the attempt (retry.py)
        self.streak = streak  # consecutive failures, for max_failures
        # The driver's stop state, read when it matters (a signal handler may flip it any time):
        self.stopping = stopping  # first Ctrl-C / SIGTERM: trials stop after their current epoch
        self.aborting = aborting  # second one: the driver kills the trials
        self.guard = guard  # calls the Optuna storage, riding out a database outage (outage.py)
        self.pauses = pauses  # a trial scheduler's pauses (pauses.py); None without one

    def handle(self, r: Running) -> None:
        """Drain everything the trial sent, then notice if its process ended (or it was lost)."""
        if r.lost is not None and r.number in self.running:
            self.on_lost(r)
            return
        self._drain(r)
        if r.number in self.running and r.process is not None and not r.process.is_alive():
            # It may have sent its result and exited between the drain and is_alive(): drain again.
            self._drain(r)
            if r.number in self.running:
                r.process.join()
                self.runner.retire(r)
                self.on_exit_without_result(r)

    def _drain(self, r: Running) -> None:
        while r.number in self.running:
            msg = next_message(r.conn)
            if msg is None:
                return
            kind = msg[0]
            if kind == "epoch":
                self.on_epoch(r, msg[1], msg[2])
            elif kind == "params":  # an own loop's trial.log_params
                self.tracker.log_loop_params(r, msg[1])
            elif kind in ("done", "fail"):
                # Its result is in: the process exits by itself; not waited for here (runner.retire).
                if kind == "done":
                    self.on_done(r, msg[1])
                else:
                    self.on_fail(r, msg[1])
                self.runner.retire(r)

    def on_epoch(self, r: Running, epoch: int, metrics: dict[str, float]) -> None:
        r.epoch = epoch
        value = metrics.get(self.metric)
        finite = value is not None and value == value  # not NaN
        if finite:
            r.last_value = value
        # Without a pruner the reply cannot depend on Optuna's report: the child goes on at once and
        # the report is written while it trains (a reaped trial is still seen there, and stopped).
        if finite and not self.never_prunes and not self._report(r, value, epoch):
            return
        # After its last epoch a trial is done anyway: a Ctrl-C then must not make it an interrupted one.
        last = epoch >= int(r.config["trainer"]["max_epochs"])
        stop = r.pruned_at is not None or (self.stopping() and not last)
        pause = self.pauses is not None and self.pauses.stop_here(r, epoch)  # its rung: it pauses (pauses.py)
        reply = "stop" if stop or pause else "continue"
        staged = self.tracker.stage_upload(r)  # before the reply: the child cannot overwrite last.pt yet
        # A trial scheduler ranks a NaN epoch worst: Optuna gets it too (a PBT boundary waits for every
        # member's value there; the epoch budget counts it). Under a pruner a NaN report would prune.
        told = finite or self.pauses is not None
        if pause and not stop and self.pauses.scheduler.goes_on_when_next:
            # Its pause point: the scheduler sees its value there, then it may go on in this process
            # when it would be the next resume anyway (pauses.go_on answers it), else it pauses.
            if told and self.never_prunes and not self._report(r, value if finite else float("nan"), epoch):
                return
            told = False  # (reported)
            if self.pauses.go_on(r, epoch, value, lambda: _answer(r, "continue")):
                reply = None
        if reply is not None:
            _answer(r, reply)
        if told and self.never_prunes and not self._report(r, value if finite else float("nan"), epoch):
            return
        # The child trains its next epoch while we record this one (the pruner needed Optuna's report only):
        # its metrics are batched for the upload thread, and a heartbeat is written only when one is due
        # (the heartbeat thread beats every interval anyway).
        self.tracker.log_epoch(r, epoch, metrics)
        self.tracker.upload(r, staged)
        self.guard(beat, self.storage, r)
        self.progress.epoch(r.number, epoch)

    def _report(self, r: Running, value: float, epoch: int) -> bool:
        """Report to the pruner (and ask it, when there is one); False when the trial was lost."""
        try:
            self.pruning.report(r, value, epoch)
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker reaped it
            r.lost = self.guard(lost_reason, self.storage, r) or Lost("Optuna has it finished while it still ran here")
            self.on_lost(r)
            return False
        if r.pruned_at is None and not self.never_prunes and self.pruning.should_prune(r):
            r.pruned_at = epoch
        return True

    def finish(self, r: Running, state: TrialState, tags: dict[str, str], value: float | None = None,
               model_info: dict | None = None, retry: str | None = None, overrides: dict | None = None) -> None:
        """Tell Optuna now (and queue a retry copy when `retry` names why); close the MLflow run now,
        or after its model is logged (background). MLflow records the state Optuna has."""
        number = r.number
        if r.output is not None:
            r.output.read()  # what it printed before its result: shown before its line
        self.running.pop(number, None)
        self.pruning.finish(r, state, value[self._primary] if isinstance(value, list) else value)
        if self.pauses is not None and state == TrialState.COMPLETE:
            tags.update(self.pauses.completed(r))  # hpolab.rung: the top rung it reached
        if retry is not None:  # owed before the FAIL is told: a driver killed in between leaves it to the next one
            try:
                self.guard(lifecycle.owe_retry, self.storage, r.trial._trial_id, retry, overrides)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another worker reaped it (and queued its copy): the tell below says so
        tail = self._output_tail(r, state, tags)
        frozen = self._tell(r, state, value, tags)
        if not r.awaits_export:  # (one that does is answered, and its pipes closed, by the tracker)
            r.close_pipes()
        if frozen is None or frozen.state != state or "hpolab.tell_error" in tags:  # Optuna's state is the truth
            state, value, model_info, retry = disagreement(frozen, state, value, model_info, retry, tags)
        copy = None
        if retry is not None:
            copy = self.guard(lifecycle.queue_retry, self.retry, self.study, frozen, retry, overrides)
            tags["hpolab.fail_reason"] += (f"; retried as trial {copy}, resuming from its last checkpoint" if copy is not None
                                           else f"; {self.retry.refusal(retry)}")
            if copy is not None:
                tags["hpolab.retried_as_trial"] = str(copy)
        self.streak.record(state, copy is not None, tags.get("hpolab.fail_kind"), tags.get("hpolab.fail_reason"), number)
        self.tracker.finish(r, state, tags, model_info, upload_last=copy is not None)
        history = frozen.intermediate_values if frozen is not None else {}  # the line says best and last, like the table
        self.progress.trial_finished(number, state.name, value if value is not None else r.last_value, tags.get("hpolab.fail_reason"), self.guard(trial_counts, self.study), history,
                                     trial=frozen, output=tail)

    def _output_tail(self, r: Running, state: TrialState, tags: dict[str, str]) -> list[str]:
        """A trial that failed by its own doing: the last lines it printed, on its run and (for `study
        status`) its Optuna trial, with the fail reason; the failure line shows them too."""
        if state != TrialState.FAIL or r.output is None or tags.get("hpolab.fail_kind") in NOT_THE_TRIALS_FAULT:
            return []
        tail = r.output.last_lines()
        if tail:
            tags["hpolab.output_tail"] = "\n".join(tail)
        try:
            record = {"reason": tags.get("hpolab.fail_reason", ""), "output": tail}
            self.guard(self.storage.set_trial_system_attr, r.trial._trial_id, FAILURE_ATTR, record)
        except StudyError:
            raise
        except Exception:  # (another worker reaped it meanwhile: Optuna has it finished; the run still says it)
            pass
        return tail

    def _tell(self, r: Running, state: TrialState, value: float | None, tags: dict[str, str]) -> FrozenTrial | None:
        """Tell Optuna; the trial as Optuna has it afterwards (None when it cannot be read)."""
        attempts = 0

        def tell() -> None:
            nonlocal attempts
            attempts += 1  # a retry after an outage: the first tell may have gone through, its reply lost
            lifecycle.tell(self.study, r.trial, state, value, skip_if_finished=attempts > 1)

        try:
            self.guard(tell)
        except StudyError:
            raise  # the store stayed unreachable past storage_outage_grace: the driver stops
        except Exception as e:  # e.g. another worker reaped it: Optuna has it FAIL already
            tags["hpolab.tell_error"] = f"{type(e).__name__}: {e}"
        try:
            return self.guard(self.storage.get_trial, r.trial._trial_id)
        except StudyError:
            raise
        except Exception as e:
            tags.setdefault("hpolab.tell_error", f"reading the trial back: {type(e).__name__}: {e}")
            return None

    def on_lost(self, r: Running) -> None:
        """Another worker reaped this trial while it ran here: stop the child. Reaped (Optuna has it FAIL
        and its retry is queued there): the run is closed FAIL with why (no model, no second retry).
        Put back to paused (a trial scheduler's segment): its trial and run go on elsewhere, nothing ends here."""
        if r.process is not None and r.process.is_alive():
            r.process.kill()
        self.runner.retire(r)
        if r.lost.put_back:  # Optuna keeps it RUNNING: its trial and run go on elsewhere, nothing to end here
            self.running.pop(r.number, None)
            self.tracker.metrics.forget(r.run_id)
            r.close_pipes()
            self.progress.note(f"trial {r.number}: {r.lost.why}; stopped here")
            return
        self.finish(r, TrialState.FAIL, {"hpolab.fail_reason": r.lost.why,
                                         "hpolab.fail_kind": "reaped", "hpolab.epochs_run": str(r.epoch)})

    def on_done(self, r: Running, info: dict[str, Any]) -> None:
        r.awaits_export = bool(info.get("export_in_child"))  # it saves its model if the tracker says so
        if self.pauses is not None and self.pauses.pausing(r, info):  # stopped at its rung: paused, not finished
            frozen = self.pauses.read(r)
            if self.pauses.never_finite(r, frozen):  # (ASHA: nothing to rank it by; it fails as a plain trial would)
                self.finish(r, TrialState.FAIL, {
                    "hpolab.fail_reason": f"the study metric {self.metric} was never finite (NaN or inf after each of "
                                          f"{info['epochs_run']} epochs): check {metrics_source(info)}",
                    "hpolab.fail_kind": "metric", "hpolab.epochs_run": str(info["epochs_run"])})
                return
            if info.get("last_checkpoint_epoch") != info["epochs_run"]:  # (a loop that did not checkpoint this epoch)
                self._cannot_pause(r, info)  # a resume would train and log its epochs again
                return
            self.pauses.pause(r, info, frozen)
            return
        tags = {
            "hpolab.best_epoch": str(info["best_epoch"]),
            "hpolab.epochs_run": str(info["epochs_run"]),
            "hpolab.stop_reason": info["stop_reason"],
            "hpolab.amp": info["amp"],
            "hpolab.device": info["device"],
        }
        if info["best_checkpoint"]:
            self.tracker.log_file(r.run_id, info["best_checkpoint"], "checkpoints")
        elif info["best_epoch"]:  # (study check then expects no best.pt; the routine checkpoints every best epoch)
            tags["hpolab.best_checkpoint_missing"] = f"train() did not call trial.checkpoint at its best epoch ({info['best_epoch']})"
        if info.get("pruned_by_train") and r.pruned_at is None:  # an own loop raised optuna.TrialPruned itself
            r.pruned_at = int(info["epochs_run"])
        if self.spec is not None:  # objectives/constraints: values, constraints, cost metrics
            tags.update(objective_values.record(self.spec, r.trial, info.get("objectives"), self.guard))
            measured = r.config.get("cost_metrics") or []  # built in and the experiment's own
            costs = {k: v for k, v in (info.get("objectives") or {}).items() if k in measured}
            if costs:  # (epoch metrics are logged each epoch already)
                self.tracker.log_epoch(r, int(info["epochs_run"]), costs)
        if r.pruned_at is not None:
            tags["hpolab.pruned_at_epoch"] = str(r.pruned_at)
            self.finish(r, TrialState.PRUNED, tags, model_info=info)  # a model only with log_models: all
            return
        if info["stop_reason"] == "stopped_by_caller" and info["epochs_run"] < int(r.config["trainer"]["max_epochs"]):
            tags["hpolab.fail_reason"] = f"interrupted (Ctrl-C or SIGTERM) after epoch {info['epochs_run']}"
            tags["hpolab.fail_kind"] = "interrupted"
            self.finish(r, TrialState.FAIL, tags, retry="interrupted")
            return
        best = float(info["best_value"])
        tags[f"hpolab.best_{self.metric}"] = repr(best)
        if not math.isfinite(best):  # Optuna would record FAIL (a warning only): say why in both stores
            tags["hpolab.fail_reason"] = (f"the study metric {self.metric} was never finite (NaN or inf after each of "
                                          f"{info['epochs_run']} epochs): check {metrics_source(info)}")
            tags["hpolab.fail_kind"] = "metric"
            self.finish(r, TrialState.FAIL, tags)
            return
        told = objective_values.optuna_values(self.spec, info.get("objectives"), best) if self.spec is not None else best
        bad = objective_values.not_finite(self.spec, told) if self.spec is not None else []
        if bad:
            tags["hpolab.fail_reason"] = f"objective {', '.join(bad)} is not finite (NaN or inf): check {metrics_source(info)}"
            tags["hpolab.fail_kind"] = "metric"
            self.finish(r, TrialState.FAIL, tags)
            return
        self._record_tie_break(r, int(info["best_epoch"]))
        self.finish(r, TrialState.COMPLETE, tags, value=told, model_info=info)

    def _record_tie_break(self, r: Running, epoch: int) -> None:
        """Its loss at its result epoch, for a tie on the study metric (ranking.tie_break)."""
        if self.spec is not None and self.spec.is_multi_objective:
            return
        tie = ranking.tie_break(self.metric, {m.key: m.value for m in points_at(r.metric_points, epoch)})
        if tie is not None:
            try:
                self.guard(self.storage.set_trial_system_attr, r.trial._trial_id, ranking.TIE_ATTR, tie)
            except StudyError:
                raise
            except Exception:  # (reaped meanwhile: its tell says so next)
                pass

    def _cannot_pause(self, r: Running, info: dict[str, Any]) -> None:
        """A loop at its pause without a checkpoint of that epoch (only an own loop can: the routine writes
        last.pt every epoch): FAIL (the study stops: every trial of this loop would do the same); its
        epochs stay, once each, and count as trained."""
        epoch = int(info["epochs_run"])
        self.finish(r, TrialState.FAIL, {
            "hpolab.fail_reason": f"train() reached its pause at epoch {epoch} without a checkpoint of that epoch: the trial "
                                  f"scheduler ({self.spec.trial_scheduler.type}) resumes a trial from its checkpoint; pass "
                                  "checkpoint= to trial.report every epoch (or call trial.checkpoint)",
            "hpolab.fail_kind": "contract", "hpolab.epochs_run": str(epoch)})

    def on_fail(self, r: Running, info: dict[str, Any]) -> None:
        tags = {"hpolab.fail_reason": info["reason"], "hpolab.fail_kind": info["kind"], "hpolab.epochs_run": str(r.epoch)}
        if info["kind"] == "nan" and r.config["trainer"].get("amp") in ("fp16", "auto"):
            tags["hpolab.fail_hint"] = "non-finite loss; if this ran under fp16 AMP, try trainer.amp=off or bf16, or a lower lr"
        self.tracker.log_text(r.run_id, "traceback.txt", info.get("traceback", "") + ("\n" + info["memory_summary"] if info.get("memory_summary") else ""))
        retry, overrides = None, None
        if info["kind"] == "oom":
            t = r.config["trainer"]
            if t["batch_size"] < 2:
                tags["hpolab.fail_reason"] += " (micro-batch already 1: cannot halve)"
            else:
                # The next attempt keeps the effective batch with half the memory; the fault injection
                # that caused a test's OOM is cleared so the retry can succeed.
                retry, overrides = "oom", {"batch_size": t["batch_size"] // 2, "grad_accum_steps": t["grad_accum_steps"] * 2,
                                           "inject_oom_at_step": None}
                self.progress.note(f"trial {r.number}: CUDA OOM; retrying with batch_size={overrides['batch_size']} "
                                   f"x {overrides['grad_accum_steps']} accumulation")
        self.finish(r, TrialState.FAIL, tags, retry=retry, overrides=overrides)

    def on_timeout(self, r: Running, limit: float) -> None:
        """Past trial_timeout: killed, FAIL, and retried from its last checkpoint (up to max_retries)."""
        r.process.kill()
        self.runner.retire(r)  # SIGKILL: gone in a moment; not waited for on the loop
        self.finish(r, TrialState.FAIL, {"hpolab.fail_reason": f"trial exceeded trial_timeout ({limit:g} s) and was stopped",
                                         "hpolab.fail_kind": "timeout", "hpolab.epochs_run": str(r.epoch)}, retry="timeout")

    def on_exit_without_result(self, r: Running) -> None:
        """The process ended without a message."""
        code = r.process.exitcode
        if self.aborting():  # we killed it on the second Ctrl-C/SIGTERM: resumable, like the first
            self.finish(r, TrialState.FAIL, {
                "hpolab.fail_reason": f"stopped by a second Ctrl-C/SIGTERM during epoch {r.epoch + 1}",
                "hpolab.fail_kind": "interrupted", "hpolab.epochs_run": str(r.epoch)}, retry="interrupted")
            return
        self.finish(r, TrialState.FAIL, {"hpolab.fail_reason": exit_reason(code), "hpolab.fail_kind": "process", "hpolab.epochs_run": str(r.epoch)})


def _answer(r: Running, reply: str) -> None:
    """The driver's answer to an epoch ("continue" or "stop")."""
    try:
        r.conn.send(reply)
    except OSError:  # BrokenPipe/ConnectionReset: the child died after its epoch; handle() sees its exit
        pass
