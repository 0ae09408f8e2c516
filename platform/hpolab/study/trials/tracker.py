"""The MLflow side of a study's trials: one child run per trial under the study's parent run.

The driver is the only writer to MLflow (trial processes never touch it). On the driver's loop a
trial's run costs two writes when it starts (the run with every tag, code tags included; its params
in one batch: the run id is needed first) and none per epoch: its epochs' metrics are batched
(metric_batches.py) and, like everything slower, written in the background, in order, on one upload
thread (uploads.py): config.yaml and the code file (first), the epochs' metrics, checkpoint uploads (at most every `checkpoint_upload_every` seconds, latest
only), artifacts, the model (per `log_models`: the folder the trial process saved, child_export.py,
waited for on a thread of its own, never on the upload thread), the close, and retention
(retention.py). The parent
run (one per study, shared by all its workers) is in parent_run.py.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from hpolab.stores import mlflow_runs as tr
from hpolab.stores.artifacts import upload_checkpoints
from hpolab.stores.code_artifacts import code_tags, upload_code
from hpolab.stores.model_links import link_trial_metrics, trial_model_name, trial_model_tags
from hpolab.stores.models import log_saved_model, log_trial_model
from hpolab.study.trials.child_export import answer_child, receive_model
from hpolab.study.trials.metric_batches import MetricBatches
from hpolab.study.objectives.ranking import apply_rank_tags
from hpolab.study.state import lifecycle
from hpolab.study.state.outage import passthrough
from hpolab.study.retention.retention import Retention, tidy_finished
from hpolab.study.state.retry import RetrySource, retry_source  # noqa: F401  (re-exported: the driver imports them here)
from hpolab.study.trials.runner import Running
from hpolab.study.trials.trial_output import log_files
from hpolab.study.trials.uploads import Uploader, stage_checkpoints, upload_due

MLFLOW_STATUS = {TrialState.COMPLETE: "FINISHED", TrialState.PRUNED: "KILLED", TrialState.FAIL: "FAILED"}
# A model that cannot be rebuilt from its checkpoint (an own training loop's, study/trials/trial.py: the
# trial says so by not sending "model_from_checkpoint") is the copy trial.log_model kept in its process
NO_OWN_MODEL = "train() logged no model (call trial.log_model(model, input_example))"
OWN_MODEL_LOST = "no model is logged (an own training loop's model is only in its process)"
PAUSE_UPLOAD_WAIT = 300.0  # seconds a pause waits for its checkpoint's upload (behind the jobs queued before it)
REAPER_CLOSE_WAIT = 30.0  # seconds a reaped trial's owner waits for the reaper's close of its run


class TrialTracker:
    """MLflow runs of trials: start, epochs, artifacts, and close (with the model, in the background)."""

    def __init__(self, client, experiment_id: str, parent_run_id: str, study_name: str, experiment: Any,
                 env_tags: dict[str, str], note: Callable[[str], None], retention: Retention | None = None,
                 upload_every: float | None = None, guard: Callable[..., Any] = passthrough,
                 mlflow_guard: Callable[..., Any] = passthrough, code=None):
        self.client = client
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.study_name = study_name
        self.experiment = experiment  # the loaded module: log_trial_model rebuilds the model from it
        self.env_tags = env_tags
        self.note = note
        self.retention = retention
        self.upload_every = upload_every  # seconds between checkpoint uploads of a running trial (None: never)
        # Store calls ride out a database outage (outage.py): `guard` for Optuna, `mlflow_guard` for
        # MLflow (a tracking store on a database server; the upload thread's jobs too).
        self.guard, self.mlflow_guard = guard, mlflow_guard
        self.uploads = Uploader(note, mlflow_guard)
        self.code = code  # the experiment's ExperimentCode: code/<module>.py on every trial run (None: no file)
        self.metrics = MetricBatches()  # epochs not yet handed to the upload thread, per run
        self.resumed_runs: set[str] = set()  # runs of paused trials resumed here: earlier points were logged elsewhen

    def start_run(self, trial: optuna.Trial, config: dict[str, Any], trial_dir: Path, tags: dict[str, str],
                  params: dict[str, Any] | None = None) -> str:
        """The trial's child run with its params (`params`, default: the config's; on the loop), config.yaml
        and code file (queued first on the upload thread: the trial process starts meanwhile); its id goes
        on the Optuna trial."""
        if self.code is not None:  # what `hpolab reproduce` / `promote` load where the module is not importable
            tags = {**tags, **code_tags(self.code)}
        run_id = lifecycle.run_created(trial, lambda: self.mlflow_guard(tr.start_child_run, self.client, self.experiment_id,
                                                                        self.parent_run_id, self.study_name, trial.number, tags), self.guard)
        self.mlflow_guard(tr.log_params, self.client, run_id, tr.flatten(config if params is None else params), new_run=True)
        self.metrics.start(run_id)
        cfg_path = trial_dir / "config.yaml"
        import yaml

        cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.uploads.submit(f"trial {trial.number}: uploading config.yaml", self.client.log_artifact, run_id, str(cfg_path))
        if self.code is not None:
            self.uploads.submit(f"trial {trial.number}: uploading its code", upload_code, self.client, run_id, self.code)
        return run_id

    def carry_over_history(self, r: Running, checkpoint: str, metric: str, report=None) -> None:
        """A retry resumes at epoch k+1; give its trial and run epochs 1..k from the checkpoint, so the
        pruner compares whole learning curves and the run page shows one continuous history."""
        from hpolab.train.checkpoint import load_checkpoint

        try:
            history = load_checkpoint(checkpoint, map_location="cpu").get("history") or []
        except Exception as e:  # the child will report the same problem when it loads it
            self.note(f"trial {r.number}: could not read {checkpoint}: {e}")
            return
        for h in history:
            epoch = int(h["epoch"])
            metrics = {k: v for k, v in h.items() if k != "epoch"}
            r.metric_points += self.metrics.add(r.run_id, epoch, metrics)
            value = metrics.get(metric)
            if value is not None and value == value:
                if report is not None:  # the pruner's report (pruning.py: the trial, or its companion)
                    report(r, value, epoch)
                else:
                    self.guard(r.trial.report, value, epoch)
                r.last_value = value
            r.epoch = epoch
        self.flush_metrics(r.run_id)
        self.mlflow_guard(tr.set_tags, self.client, r.run_id, {"hpolab.resumed_after_epoch": str(r.epoch)})

    def pause(self, r: Running, tags: dict[str, str]) -> None:
        """A paused trial (driver/pauses.py): its checkpoint uploaded (it may resume on another worker),
        its process told to save no model, its run left open with `tags`. Returns once the upload has
        landed: only then may the trial be marked paused, as a worker on another host claiming it
        finds its checkpoint only in the run. The wait blocks the driver's loop for the upload queue,
        at every pause (each trial at each rung or PBT interval)."""
        self.flush_metrics(r.run_id)
        self.upload(r, self.stage_upload(r, force=True))
        self.uploads.submit(f"trial {r.number}: uploading its output", self._log_output, r)  # (what it printed so far)
        landed = threading.Event()
        self.uploads.submit(f"trial {r.number}: pausing", landed.set)  # (FIFO: after its upload)
        self.metrics.forget(r.run_id)
        if r.awaits_export:
            answer_child(r.conn, r.lifeline, False)
        else:
            r.close_pipes()
        if not landed.wait(PAUSE_UPLOAD_WAIT):
            self.note(f"trial {r.number}: its checkpoint upload is still queued after {PAUSE_UPLOAD_WAIT:g} s; marked paused "
                      "anyway (a worker on another host that resumes it may find an older checkpoint)")
        self.mlflow_guard(tr.set_tags, self.client, r.run_id, tags)  # now: another worker may resume it next

    def resume(self, r: Running, tags: dict[str, str], params: dict[str, float], logged: int = 0) -> None:
        """A paused trial resumes in its own run: `tags` set now, `params` logged at the first epoch it
        trains again (PBT's schedule: the values from that epoch on). `logged`: the last epoch the run
        has already (a dead driver's segment, driver/pauses.py): epochs up to it are not logged again."""
        self.mlflow_guard(tr.set_tags, self.client, r.run_id, tags)
        self.metrics.start(r.run_id)
        self.resumed_runs.add(r.run_id)
        if logged > r.epoch:
            r.logged_until = logged
        if params:
            self.log_epoch(r, r.epoch + 1, params)

    def log_epoch(self, r: Running, epoch: int, metrics: dict[str, float]) -> None:
        """Batched (metric_batches.py): written from the upload thread, not on the driver's loop.
        Kept on `r` too: its model's metric links are made from them (model_links.points_at)."""
        if epoch <= r.logged_until:
            return  # (the run has this epoch from a segment whose driver died: its values stay)
        r.metric_points += self.metrics.add(r.run_id, epoch, metrics)
        if self.metrics.due(r.run_id):
            self.flush_metrics(r.run_id)

    def flush_metrics(self, run_id: str) -> None:
        """Queue the run's batched metrics (before any other job of that run: FIFO keeps them first)."""
        batch = self.metrics.take(run_id)
        if batch:
            self.uploads.submit(f"logging {len(batch)} metric points", tr.log_metrics, self.client, run_id, batch)

    def flush_all_metrics(self) -> None:
        for run_id in self.metrics.runs():
            self.flush_metrics(run_id)

    def stage_upload(self, r: Running, force: bool = False) -> Path | None:
        """When an upload is due (or `force`): hard-link the trial's checkpoints for upload (O(1)).
        Call before replying to the child, so what is staged is exactly epoch `r.epoch`."""
        now = time.monotonic()
        if not (force or upload_due(r.uploaded_at, self.upload_every, now)) or r.uploaded_epoch >= r.epoch:
            return None
        folder, r.best_id = stage_checkpoints(r.trial_dir, r.epoch, r.best_id)
        if folder is not None:
            r.uploaded_at, r.uploaded_epoch = now, r.epoch
        return folder

    def upload(self, r: Running, folder: Path | None) -> None:
        """Queue the staged checkpoints' upload to the run's checkpoints/ (overwrites: latest only)."""
        if folder is not None:
            self.flush_metrics(r.run_id)
            self.uploads.submit(f"trial {r.number}: uploading its checkpoint", self._upload, r.run_id, folder, r.uploaded_epoch)

    def _upload(self, run_id: str, folder: Path, epoch: int) -> None:
        upload_checkpoints(self.client, run_id, folder)
        tr.set_tags(self.client, run_id, {"hpolab.checkpoint_epoch": str(epoch)})

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        tr.set_tags(self.client, run_id, tags)

    def set_tags_later(self, r: Running, tags: dict[str, str]) -> None:
        """The run's `tags`, on the upload thread (after what was queued for it before)."""
        self.uploads.submit(f"trial {r.number}: tagging its run", tr.set_tags, self.client, r.run_id, tags)

    def log_file(self, run_id: str, path: str, artifact_path: str | None = None) -> None:
        self.flush_metrics(run_id)
        self.uploads.submit(f"uploading {path}", self.client.log_artifact, run_id, path, artifact_path)

    def log_loop_params(self, r: Running, params: dict[str, str]) -> None:
        """A loop's trial.log_params, on the upload thread; a param the run has with another value
        stays (MLflow params are write-once) and the conflict is noted."""
        def log() -> None:
            have = self.client.get_run(r.run_id).data.params
            clash = sorted(k for k, v in params.items() if k in have and have[k] != tr.redact(str(v))[:tr.MAX_PARAM_LEN])
            if clash:
                self.note(f"trial {r.number}: trial.log_params: {', '.join(clash)} recorded already with another value; kept")
            tr.log_params(self.client, r.run_id, {k: v for k, v in params.items() if k not in have}, new_run=True)

        self.uploads.submit(f"trial {r.number}: logging its params", log)

    def log_text(self, run_id: str, name: str, text: str) -> None:
        self.flush_metrics(run_id)
        self.uploads.submit(f"uploading {name}", self._log_text, run_id, name, text)

    def _log_text(self, run_id: str, name: str, text: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / name
            p.write_text(text)
            self.client.log_artifact(run_id, str(p))

    def close_run(self, run_id: str, state: TrialState, tags: dict[str, str]) -> None:
        lifecycle.close_run(self._close, run_id, state, tags)

    def _close(self, run_id: str, state: TrialState, tags: dict[str, str]) -> None:
        self.mlflow_guard(tr.set_tags, self.client, run_id, {"hpolab.state": state.name, **tags})
        self.mlflow_guard(tr.end_run, self.client, run_id, MLFLOW_STATUS[state])  # (set_terminated reads the run back first)

    def close_run_if_open(self, run_id: str, state: TrialState, tags: dict[str, str]) -> None:
        """Close another driver's run (a reaped trial's) unless its owner has (tr.close_if_running)."""
        lifecycle.close_run(lambda *a: self.mlflow_guard(tr.close_if_running, self.client, run_id, {"hpolab.state": state.name, **tags},
                                                         MLFLOW_STATUS[state]), run_id, state, tags)

    def finish(self, r: Running, state: TrialState, tags: dict[str, str], model_info: dict | None = None,
               upload_last: bool = False) -> None:
        """Queue the trial's last checkpoint (`upload_last`: a retry, maybe on another worker, resumes
        from it), its model (per log_models), its run's close, then retention."""
        self.flush_metrics(r.run_id)
        if upload_last:
            self.upload(r, self.stage_upload(r, force=True))
        self.metrics.forget(r.run_id)
        if model_info is not None:
            skip = self.retention.skip_model(state, r.number) if self.retention else (None if state == TrialState.COMPLETE else "not COMPLETE")
            if not skip and not model_info.get("model_from_checkpoint") and not model_info.get("model_logged"):
                skip = tags["hpolab.model_skipped"] = NO_OWN_MODEL  # (nothing to rebuild it from)
            if skip:
                if state == TrialState.COMPLETE:  # a COMPLETE trial without a model says why
                    tags["hpolab.model_skipped"] = skip
                model_info = None
        # A trial process that waits is told now whether to save its model (it does while the next
        # trial starts). Logging a model takes a while: on the upload thread, so the running trials'
        # epochs (and pruning decisions) never wait behind it. Its save can take long too (up to
        # SAVE_WAIT_S): that wait has a thread of its own (uploads.after), so the upload thread
        # serves the other trials' checkpoints meanwhile and queues the model and close when it is saved.
        label = f"trial {r.number}: closing its run"
        child = answer_child(r.conn, r.lifeline, model_info is not None) if r.awaits_export else None
        if child is None:
            self.uploads.submit(label, self._log_model_then_close, r, model_info, tags, state, None)
        else:
            then = "exporting it from its checkpoint here" if model_info.get("model_from_checkpoint") else OWN_MODEL_LOST

            def on_problem(why: str) -> None:
                self.note(f"trial {r.number}: {why}")
                model_info["export_problem"] = why

            self.uploads.after(label, lambda: receive_model(*child, on_problem=on_problem, then=then),
                               self._log_model_then_close, r, model_info, tags, state)
        self._retain()

    def _log_model_then_close(self, r: Running, info: dict[str, Any] | None, tags: dict[str, str], state: TrialState,
                              saved: str | None = None) -> None:
        """`saved`: the model folder the trial process saved (None: export it here from the checkpoint)."""
        if info is not None:
            if r.model_tags is None:  # (a job retried after a store outage does not log the model twice)
                r.model_tags = self._log_model(r, info, saved, state)
            tags.update(r.model_tags)
        if state in (TrialState.COMPLETE, TrialState.PRUNED):  # nothing resumes it (a FAIL may be retried)
            try:
                tags.update(tidy_finished(self.client, r.run_id, r.trial_dir))
            except Exception as e:  # its files stay; the result stands
                self.note(f"trial {r.number}: deleting its last.pt: {type(e).__name__}: {e}")
        self._log_output(r)
        if tags.get("hpolab.fail_kind") == "reaped":
            # Another worker reaped this trial while it ran here and closes its run too (heartbeat.py
            # reap_trial), with a worse reason ("its driver is gone"). Its close checks then writes:
            # ours, written after its check, would be overwritten. Once its close is in, ours goes
            # over it and stays; a reaper that never closes it costs this wait and no more.
            self.mlflow_guard(tr.wait_until_closed, self.client, r.run_id, REAPER_CLOSE_WAIT)
        self.close_run(r.run_id, state, tags)

    def _log_output(self, r: Running) -> None:
        """What the trial printed (trial_output.py), as its run's output.log (and output.1.log)."""
        for path in log_files(r.trial_dir):
            try:
                self.client.log_artifact(r.run_id, str(path))
            except Exception as e:  # noqa: BLE001 -- the trial's result stands; its folder keeps the file
                self.note(f"trial {r.number}: uploading {path.name}: {type(e).__name__}: {e}")

    def _log_model(self, r: Running, info: dict[str, Any], saved: str | None, state: TrialState) -> dict[str, str]:
        """Log the folder the trial process saved, or (a DDP trial, or its process could not) export
        the model here from its checkpoint, named and tagged for the trial, with the metrics of the
        epoch it was saved from linked to it (model_links.py). The tags to put on its run."""
        name = trial_model_name(self.study_name, r.number)
        model_tags = trial_model_tags(self.study_name, r.number, state.name)
        try:
            if saved is not None:
                tags = log_saved_model(saved, r.run_id, name, model_tags)
            elif not info.get("model_from_checkpoint"):  # its model existed only in its process: no checkpoint rebuilds it
                return {"hpolab.model_error": info.get("export_problem") or f"its process did not save the model; {OWN_MODEL_LOST}"}
            else:
                tags = log_trial_model(self.experiment, r.config, info, r.run_id, self.env_tags, name, model_tags)
        except Exception as e:  # the trial's result stands even if the model could not be logged
            self.note(f"trial {r.number}: logging the model failed: {e}")
            return {"hpolab.model_error": f"{type(e).__name__}: {e}"}
        finally:
            if saved is not None:  # the store's copy is the one kept
                shutil.rmtree(saved, ignore_errors=True)
        try:
            # (a resumed run's best epoch may be in an earlier segment: its points are read back from the run)
            logged = None if r.run_id in self.resumed_runs else r.metric_points
            link_trial_metrics(self.client, r.run_id, tags["hpolab.model_id"], int(info["best_epoch"]), info.get("objectives") or {},
                               logged=logged)
        except Exception as e:  # the model stands; `study check --repair` links them later
            self.note(f"trial {r.number}: linking its metrics to its model failed: {e}")
        # the epoch its weights are from: best.pt's (the routine), the one the own loop gave trial.log_model
        return {**tags, "hpolab.model_epoch": str(info.get("model_epoch") or info["best_epoch"])}

    def _retain(self, last: bool = False) -> None:
        # one read of the study for the plan and the ranks, when a pass is due (trials_due) and at the last pass
        trials = self.retention.trials_due(last) if self.retention else None
        if trials is None:
            return
        items = self.retention.plan(trials)
        if items:
            self.uploads.submit("retention", self.retention.purge, self.client, items, self.experiment_id)
        ranks = self.retention.rank_tags(trials, force=last)
        if ranks is not None:  # after the deletes: only the models still kept are tagged
            self.uploads.submit("model ranks", apply_rank_tags, self.client, self.experiment_id, self.study_name, ranks)

    def shutdown(self) -> None:
        """A last retention pass (trials other workers finished), then wait until every queued
        upload, model and close is done."""
        self.flush_all_metrics()  # (a driver stopping on an error: its trials' last epochs)
        self.uploads.settle()  # models still being saved are queued first: retention skips a run not yet closed
        try:
            self._retain(last=True)
        except Exception as e:  # e.g. the store is gone on the error path: still flush what is queued
            self.note(f"retention: {e}")
        self.uploads.close()
