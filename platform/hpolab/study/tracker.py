"""The MLflow side of a study's trials: one child run per trial under the study's parent run.

The driver is the only writer to MLflow (trial processes never touch it). A trial's run gets its
params and config.yaml when it starts, its epochs as they arrive, and on the end its state and tags;
a COMPLETE trial's model is logged by one background thread first, so running trials never wait
behind an export. The parent run (one per study, shared by all its workers) is in parent_run.py.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from hpolab.stores import mlflow_runs as tr
from hpolab.stores.models import log_trial_model
from hpolab.stores.paths import Stores
from hpolab.study.retry import OVERRIDES
from hpolab.study.runner import Running

MLFLOW_STATUS = {TrialState.COMPLETE: "FINISHED", TrialState.PRUNED: "KILLED", TrialState.FAIL: "FAILED"}


@dataclass
class RetrySource:
    """What a retry copy continues: the attempt it retries, the checkpoint to resume from, the run
    tags saying so, and trainer overrides for this attempt (e.g. the halved micro-batch after an OOM)."""

    retry_of: int | None = None
    resume_from: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)


def retry_source(study: optuna.Study, stores: Stores, study_name: str, number: int) -> RetrySource:
    """What trial `number` continues (all empty when it is not a retry copy).

    It resumes from the newest last.pt of its chain: the attempt it retries, or an earlier one when
    that attempt died before its first epoch ended."""
    trials = study.get_trials(deepcopy=False)
    me = trials[number]
    history = me.system_attrs.get("retry_history") or []
    if not history:
        return RetrySource()
    src = RetrySource(retry_of=history[-1], overrides=dict(me.system_attrs.get(OVERRIDES) or {}))
    src.tags["hpolab.retry_of_trial"] = str(src.retry_of)
    src.tags["hpolab.retry_kind"] = str(me.system_attrs.get("hpolab.retry_kind", "stale"))
    dead = trials[src.retry_of]
    if dead.user_attrs.get("mlflow_run_id"):
        src.tags["hpolab.retry_of_run"] = dead.user_attrs["mlflow_run_id"]
    for n in reversed(history):
        last = stores.trial_dir(study_name, n) / "last.pt"
        if last.exists():
            src.resume_from = str(last)
            src.tags["hpolab.resumed_from"] = src.resume_from
            break
    if src.overrides:
        src.tags["hpolab.trainer_overrides"] = " ".join(f"{k}={v}" for k, v in sorted(src.overrides.items()))
    return src


class TrialTracker:
    """MLflow runs of trials: start, epochs, artifacts, and close (with the model, in the background)."""

    def __init__(self, client, experiment_id: str, parent_run_id: str, study_name: str, experiment: Any,
                 env_tags: dict[str, str], note: Callable[[str], None]):
        self.client = client
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.study_name = study_name
        self.experiment = experiment  # the loaded module: log_trial_model rebuilds the model from it
        self.env_tags = env_tags
        self.note = note
        self._model_logger = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-logger")

    def start_run(self, trial: optuna.Trial, config: dict[str, Any], trial_dir: Path, tags: dict[str, str]) -> str:
        """The trial's child run with its params and config.yaml; its id goes on the Optuna trial."""
        run_id = tr.start_child_run(self.client, self.experiment_id, self.parent_run_id, self.study_name, trial.number, tags)
        trial.set_user_attr("mlflow_run_id", run_id)
        tr.log_params(self.client, run_id, tr.flatten(config))
        cfg_path = trial_dir / "config.yaml"
        import yaml

        cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.client.log_artifact(run_id, str(cfg_path))
        return run_id

    def carry_over_history(self, r: Running, checkpoint: str, metric: str) -> None:
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
            tr.log_epoch(self.client, r.run_id, epoch, metrics)
            value = metrics.get(metric)
            if value is not None and value == value:
                r.trial.report(value, epoch)
                r.last_value = value
            r.epoch = epoch

    def log_epoch(self, run_id: str, epoch: int, metrics: dict[str, float]) -> None:
        tr.log_epoch(self.client, run_id, epoch, metrics)

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        tr.set_tags(self.client, run_id, tags)

    def log_file(self, run_id: str, path: str, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, path, artifact_path)

    def log_text(self, run_id: str, name: str, text: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / name
            p.write_text(text)
            self.client.log_artifact(run_id, str(p))

    def close_run(self, run_id: str, state: TrialState, tags: dict[str, str]) -> None:
        tr.set_tags(self.client, run_id, {"hpolab.state": state.name, **tags})
        self.client.set_terminated(run_id, status=MLFLOW_STATUS[state])

    def finish(self, r: Running, state: TrialState, tags: dict[str, str], model_info: dict | None = None) -> None:
        """Close the trial's run now, or after its model is logged (in the background)."""
        if model_info is not None:
            # Exporting + logging a model takes seconds; a single background thread does it so the
            # running trials' epochs (and pruning decisions) never wait behind it.
            self._model_logger.submit(self._log_model_then_close, r, model_info, tags, state)
        else:
            self.close_run(r.run_id, state, tags)

    def _log_model_then_close(self, r: Running, info: dict[str, Any], tags: dict[str, str], state: TrialState) -> None:
        try:
            tags.update(log_trial_model(self.experiment, r.config, info, r.run_id, self.env_tags))
        except Exception as e:  # the trial's result stands even if the model could not be logged
            tags["hpolab.model_error"] = f"{type(e).__name__}: {e}"
            self.note(f"trial {r.number}: logging the model failed: {e}")
        self.close_run(r.run_id, state, tags)

    def shutdown(self) -> None:
        """Wait until every queued model is logged and its run closed."""
        self._model_logger.shutdown(wait=True)
