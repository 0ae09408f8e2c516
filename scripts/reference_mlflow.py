"""The names hpolab writes to MLflow (tags, params, metrics) and Optuna (attributes): the table
docs/reference/mlflow.md is made from (scripts/reference_docs.py).

Most names are string literals at the place that writes them. `written_names()` finds every such
literal in the package's source (`hpolab.*`, `optuna.*`, `mlflow.*`), without importing it, and
tests/test_reference_docs.py fails when a name is written but missing here, or listed here but no
longer written: a new tag needs a line below.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "platform" / "hpolab"

TR, PR, PROM, LR, MOD, VER = "trial run", "parent run", "promote run", "lr run", "model", "version"
RACE = "race run"
SA, TA = "study attr", "trial attr"

# literal in the code -> (name shown, where, meaning)
NAMES = {
    "hpolab.": ("hpolab.<metric>", VER, "the promoted trial's value of the study metric on the validation split "
                                        "(e.g. `hpolab.val_acc`); the gate's test values are `hpolab.test_<metric>`"),
    "hpolab.amp": ("hpolab.amp", TR, "the AMP mode the trial trained with"),
    "hpolab.best_": ("hpolab.best_<metric>", f"{TR}, {PR}", "the best value of a metric (a trial's best epoch; the study's best trial)"),
    "hpolab.best_checkpoint_missing": ("hpolab.best_checkpoint_missing", TR, "an own training loop did not checkpoint its best epoch: no best.pt"),
    "hpolab.best_epoch": ("hpolab.best_epoch", TR, "the epoch the trial's value, best.pt and logged model come from"),
    "hpolab.best_rule": ("hpolab.best_rule", PR, "several objectives: how the best trial was chosen (the front's knee)"),
    "hpolab.best_run_id": ("hpolab.best_run_id", PR, "the best trial's run"),
    "hpolab.best_trial": ("hpolab.best_trial", PR, "the best trial's number"),
    "hpolab.budget_epochs": ("hpolab.budget_epochs", SA, "the spec's budget.epochs (epochs over all trials), for study status"),
    "hpolab.checkpoint_epoch": ("hpolab.checkpoint_epoch", TR, "the epoch of the last.pt uploaded to checkpoints/"),
    "hpolab.checkpoints_deleted": ("hpolab.checkpoints_deleted", TR, "why the trial's checkpoints are gone (retention, prune-files)"),
    "hpolab.class_names": ("hpolab.class_names", f"{PROM}, {VER}", "the class names (JSON list) predict reports"),
    "hpolab.closed_by": ("hpolab.closed_by", PR, "who closed the parent run when its driver could not"),
    "hpolab.code_file": ("hpolab.code_file", f"{SA}, {TR}", "the experiment module's file name"),
    "hpolab.code_hash": ("hpolab.code_hash", f"{SA}, {TR}", "sha256 (16 hex digits) of the experiment module the study ran"),
    "hpolab.control": ("hpolab.control", SA, "the study's control (study pause|resume|stop|set): version, state, the run controls set, who and when"),
    "hpolab.control_applied.": ("hpolab.control_applied.<host>:<pid>", SA, "a driver that applied a control version: which, when, what it did"),
    "hpolab.config_changes": ("hpolab.config_changes", TA, "a trial scheduler's config changes so far (dotted key -> value), applied over its params"),
    "hpolab.data": ("hpolab.data", VER, "the trial's data config (JSON)"),
    "hpolab.device": ("hpolab.device", TR, "the device the trial trained on"),
    "hpolab.driver_error": ("hpolab.driver_error", PR, "the error that stopped the driver"),
    "hpolab.epochs_run": ("hpolab.epochs_run", TR, "epochs the trial trained"),
    "hpolab.experiment": ("hpolab.experiment", f"{TR}, {PROM}, {VER}", "the experiment module"),
    "hpolab.export_onnx": ("hpolab.export_onnx", VER, "the ONNX export's artifact path"),
    "hpolab.export_torchscript": ("hpolab.export_torchscript", VER, "the TorchScript export's artifact path"),
    "hpolab.export_skipped": ("hpolab.export_skipped", VER, "a version registered from the trial's logged model: why ONNX / TorchScript exports are missing"),
    "hpolab.fail_hint": ("hpolab.fail_hint", TR, "what to try after a failure (e.g. a non-finite loss)"),
    "hpolab.fail_kind": ("hpolab.fail_kind", TR, "the kind of failure (error, OOM, timeout, dead driver, ...)"),
    "hpolab.fail_reason": ("hpolab.fail_reason", f"{TR}, {PROM}", "why the trial (or promotion) failed, one line"),
    "hpolab.feasible": ("hpolab.feasible", TR, "constraints: whether the trial meets every one"),
    "hpolab.gate": ("hpolab.gate", VER, "several objectives: the gate's values of every objective"),
    "hpolab.gate_metric": ("hpolab.gate_metric", VER, "the metric the promotion gate compared on the test split"),
    "hpolab.gate_source": ("hpolab.gate_source", VER, "a version registered from the trial's logged model: evaluate (the experiment's evaluate(model, \"test\") scored it) or none (--force, no gate)"),
    "hpolab.heartbeat": ("hpolab.heartbeat", TA, "the running trial's last heartbeat (proxy stores)"),
    "hpolab.imported_from": ("hpolab.imported_from", TA, "a trial a warm start imported: where from"),
    "hpolab.last_checkpoint": ("hpolab.last_checkpoint", TR, "last.pt deleted once the trial finished (nothing resumes it)"),
    "hpolab.lr_test.reason": ("hpolab.lr_test.reason", LR, "how the LR range test chose its bounds"),
    "hpolab.lr_test.warning": ("hpolab.lr_test.warning", LR, "a warning about the LR range test's curve"),
    "hpolab.lr_test_claim": ("hpolab.lr_test_claim", TA, "which worker runs the study's LR range test"),
    "hpolab.model_config": ("hpolab.model_config", VER, "the trial's model config (JSON)"),
    "hpolab.model_deleted": ("hpolab.model_deleted", f"{TR}, {VER}", "why the trial's logged model is gone (retention, prune-files)"),
    "hpolab.metrics_restored": ("hpolab.metrics_restored", TR, "epochs a killed driver never wrote to the run, logged by a later driver: which, and from where (last.pt or Optuna)"),
    "hpolab.model_error": ("hpolab.model_error", TR, "logging the trial's model failed: why"),
    "hpolab.model_id": ("hpolab.model_id", f"{TR}, {VER}", "the trial's logged model id"),
    "hpolab.model_skipped": ("hpolab.model_skipped", TR, "why no model was logged (log_models)"),
    "hpolab.model_uri": ("hpolab.model_uri", f"{TR}, {VER}", "the trial's logged model URI (models:/m-...)"),
    "hpolab.multilabel_threshold": ("hpolab.multilabel_threshold", f"{PROM}, {VER}", "multilabel: the probability threshold"),
    "hpolab.n_trials": ("hpolab.n_trials", PR, "the study's budget of finished trials"),
    "hpolab.notify": ("hpolab.notify", SA, "the spec's notify targets (${VAR}s unexpanded), for the commands that send too (study set, promote)"),
    "hpolab.notify_session": ("hpolab.notify_session", SA, "how often the study finished: the n of each study event's claim"),
    "hpolab.notified.": ("hpolab.notified.<event>:<n>", SA, "the claim of a study event: the one driver that sends it"),
    "hpolab.notify_dropped.": ("hpolab.notify_dropped.<host>:<pid>", SA, "notifications a driver could not deliver (study status sums them)"),
    "hpolab.num_classes": ("hpolab.num_classes", f"{PROM}, {VER}", "the number of classes"),
    "hpolab.objective.": ("hpolab.objective.<name>", VER, "several objectives: the gate's value of each"),
    "hpolab.objectives": ("hpolab.objectives", TA, "several objectives: the trial's values"),
    "hpolab.on_front": ("hpolab.on_front", MOD, "several objectives: whether the trial is on the feasible Pareto front"),
    "hpolab.onnx_exporter": ("hpolab.onnx_exporter", VER, "the ONNX exporter used"),
    "hpolab.onnx_max_abs_diff": ("hpolab.onnx_max_abs_diff", VER, "largest |ONNX - PyTorch| on the test inputs"),
    "hpolab.optuna_disagreed": ("hpolab.optuna_disagreed", TR, "the state Optuna holds differs from the one told"),
    "hpolab.orphan": ("hpolab.orphan", TR, "a run no trial points at (closed by study check --repair)"),
    "hpolab.owner": ("hpolab.owner", TA, "the driver (host, pid) running the trial"),
    "hpolab.pareto_front": ("hpolab.pareto_front", PR, "several objectives: the trial numbers on the front"),
    "hpolab.pareto_rank": ("hpolab.pareto_rank", MOD, "several objectives: the trial's front (0 = the feasible front, or infeasible)"),
    "hpolab.paused": ("hpolab.paused", TA, "a trial scheduler's paused trial: {rung, epoch} while paused (Optuna keeps it RUNNING), null once resumed; a segment put back after its driver died adds interrupted: true"),
    "hpolab.interrupts": ("hpolab.interrupts", TA, "a trial scheduler's trial: how often a segment of it died with its driver and was put back to paused (at most max_interrupts)"),
    "hpolab.segment_after": ("hpolab.segment_after", TA, "a trial scheduler's trial: the epoch its current segment resumed after"),
    "hpolab.interrupted_at_epoch": ("hpolab.interrupted_at_epoch", TR, "a trial scheduler's trial whose segment died with its driver: paused again at its newest checkpoint's epoch (same trial and run)"),
    "hpolab.interrupted": ("hpolab.interrupted", TR, "why that segment was found dead (its driver gone, or its heartbeats stale)"),
    "hpolab.paused_at_epoch": ("hpolab.paused_at_epoch", TR, "the epoch the trial last paused after (its checkpoint's)"),
    "hpolab.pbt_exploited_from": ("hpolab.pbt_exploited_from", TR, "PBT: the member (first attempt's trial number) @ boundary epoch this member last copied"),
    "hpolab.pbt_parents": ("hpolab.pbt_parents", f"{TA}, {TR}", "PBT: every exploit of the member, \"3@4,5@8\" (trial attr: a list)"),
    "hpolab.pbt_paused_at_epoch": ("hpolab.pbt_paused_at_epoch", TR, "PBT: the boundary a member was still paused at when the study ended"),
    "hpolab.pbt_schedule": ("hpolab.pbt_schedule", TA, "PBT: the mutated keys' values from each epoch on, {\"1\": {key: value}, \"3\": ...} (what reproduce replays)"),
    "hpolab.pick": ("hpolab.pick", VER, "several objectives: the pick rule and why this trial"),
    "hpolab.previous_champion": ("hpolab.previous_champion", VER, "the version that held the alias before"),
    "hpolab.project_dir": ("hpolab.project_dir", SA, "the project folder the experiment was found in"),
    "hpolab.promoted_from_rung": ("hpolab.promoted_from_rung", TR, "ASHA: the rung the trial was last promoted from"),
    "hpolab.promote_run_id": ("hpolab.promote_run_id", VER, "the promote run that registered the version"),
    "hpolab.pruned_at_epoch": ("hpolab.pruned_at_epoch", TR, "the epoch the pruner stopped the trial"),
    "hpolab.pruned_at_rung": ("hpolab.pruned_at_rung", TR, "ASHA: the rung a never-promoted trial reached (0 = the first)"),
    "hpolab.config": ("hpolab.config", TA, "a seed trial of a promotion race: the whole config it trains (its candidate's, with its seed replaced)"),
    "hpolab.mlflow_experiment": ("hpolab.mlflow_experiment", SA, "a promotion race's Optuna study: the MLflow experiment its runs go in (the raced study's)"),
    "hpolab.noise_floor": ("hpolab.noise_floor", f"{SA}, {VER}", "the study's noise floor: the pooled sd of its metric over training seeds ({value, metric, source: race | noise_probe, dof, ...}; on a version: the race's value)"),
    "hpolab.noise_probe": ("hpolab.noise_probe", TA, "a noise probe's trial: the number of the incumbent it trains again on another seed (never a result)"),
    "hpolab.noise_probes": ("hpolab.noise_probes", SA, "the noise probe's rounds so far: [{incumbent, seeds}]"),
    "hpolab.promotion": ("hpolab.promotion", SA, "the spec's promotion: section as the latest driver ran it (promote's race defaults)"),
    "hpolab.race": ("hpolab.race", SA, "the study's latest finished promotion race (race.json without the seed runs' ids: what the report shows)"),
    "hpolab.race_": ("hpolab.race_<metric>_mean, hpolab.race_<metric>_ci95", VER, "the race's mean of the winner's seeds and its 95% interval (low,high)"),
    "hpolab.race_candidate": ("hpolab.race_candidate", f"{TA}, {TR}", "a promotion race's seed trial: the candidate it retrains (trial 19, champion v3)"),
    "hpolab.race_epochs": ("hpolab.race_epochs", RACE, "epochs the race's seed runs trained"),
    "hpolab.race_key": ("hpolab.race_key", RACE, "the race's identity: its candidates' configurations and seeds"),
    "hpolab.race_model_run": ("hpolab.race_model_run", VER, "the race run whose model was registered (the winner's seed nearest its mean)"),
    "hpolab.race_of": ("hpolab.race_of", SA, "a promotion race's Optuna study: the study it races for"),
    "hpolab.race_p_best": ("hpolab.race_p_best", VER, "the winner's P(best): the share of bootstrap resamples of the seeds it wins"),
    "hpolab.race_result": ("hpolab.race_result", f"{RACE}, {VER}", "the race as JSON: every candidate's seeds, values, mean, interval, P(best), round dropped"),
    "hpolab.race_rounds_recorded": ("hpolab.race_rounds_recorded", RACE, "the rounds whose standings are logged (a resumed race logs none twice)"),
    "hpolab.race_run_id": ("hpolab.race_run_id", VER, "the race run that chose the version's model"),
    "hpolab.race_seed": ("hpolab.race_seed", VER, "the seed of the race run whose model was registered"),
    "hpolab.race_seeds": ("hpolab.race_seeds", VER, "the seeds the winner raced on"),
    "hpolab.race_study": ("hpolab.race_study", RACE, "the race's own Optuna study (<study>.race-<key>)"),
    "hpolab.race_winner": ("hpolab.race_winner", f"{RACE}, {VER}", "the race's winner (its best mean)"),
    "hpolab.rank": ("hpolab.rank", MOD, "the trial's rank in its study (1 = best)"),
    "hpolab.raw_input_dtype": ("hpolab.raw_input_dtype", f"{PROM}, {VER}", "numpy dtype of a raw input, e.g. float32"),
    "hpolab.raw_input_shape": ("hpolab.raw_input_shape", f"{PROM}, {VER}", "shape of one raw input (JSON list, no batch axis)"),
    "hpolab.reaped": ("hpolab.reaped", TA, "a trial another driver failed as dead: by whom and why"),
    "hpolab.registered_model": ("hpolab.registered_model", f"{PROM}, {MOD}", "the registered model name"),
    "hpolab.registered_version": ("hpolab.registered_version", PROM, "the version the promotion registered"),
    "hpolab.retry_due": ("hpolab.retry_due", TA, "{kind, overrides}: written before a trial that gets a retry copy is told FAIL, so a driver killed between the two still queues the copy (the next driver or `study check --repair` does; one copy per attempt)"),
    "hpolab.segment_until": ("hpolab.segment_until", TA, "under a trial scheduler: {epoch, rung} where the running segment pauses (null: it runs to the end), recorded before the segment starts so a segment whose driver dies is put back without the scheduler"),
    "hpolab.put_back_by": ("hpolab.put_back_by", TR, "on a trial run whose dead segment `study check --repair` put back to paused"),
    "hpolab.failure": ("hpolab.failure", TA, "a failed trial's {reason, output}: its fail reason and the last lines it printed (`study status` shows them)"),
    "hpolab.tie_break": ("hpolab.tie_break", TA, "a COMPLETE trial's {metric, value}: its validation loss at its result epoch, which breaks a tie on the study metric"),
    "hpolab.output_tail": ("hpolab.output_tail", TR, "a failed trial's last printed lines (the whole output is the run's output.log artifact)"),
    "hpolab.model_epoch": ("hpolab.model_epoch", TR, "the epoch the logged model's weights are from (the trial's result epoch; `study check` names a model from another epoch)"),
    "hpolab.released": ("hpolab.released", TA, "a trial given back unrun: the budget was already full"),
    "hpolab.resume_error": ("hpolab.resume_error", TR, "why a retry could not resume from a checkpoint"),
    "hpolab.resume_source": ("hpolab.resume_source", TR, "where the resumed checkpoint came from"),
    "hpolab.resumed_after_epoch": ("hpolab.resumed_after_epoch", TR, "the epoch a retry (or a paused trial) resumed after"),
    "hpolab.resumed_from": ("hpolab.resumed_from", TR, "the checkpoint a retry resumed from"),
    "hpolab.retried_as_trial": ("hpolab.retried_as_trial", TR, "the trial number that continues this attempt"),
    "hpolab.retry_kind": ("hpolab.retry_kind", TR, "why this attempt is a retry"),
    "hpolab.retry_kinds": ("hpolab.retry_kinds", TA, "why each earlier attempt ended"),
    "hpolab.retry_of_run": ("hpolab.retry_of_run", TR, "the run of the attempt this one continues"),
    "hpolab.retry_of_trial": ("hpolab.retry_of_trial", TR, "the trial this attempt continues"),
    "hpolab.role": ("hpolab.role", "every run", "what the run is: trial, study, promote, lr_range_test, race"),
    "hpolab.rung": ("hpolab.rung", f"{TA}, {TR}", "a trial scheduler: the highest rung the trial reached (0 = the first): the one it paused at, the top one once it completed there"),
    "hpolab.sampler_seed": ("hpolab.sampler_seed", TR, "the sampler's seed in this driver"),
    "hpolab.seed": ("hpolab.seed", f"{VER}, {TA}, {TR}", "the trial's training seed (a seed trial's: the seed it trains, a race's or a noise probe's)"),
    "hpolab.selection_metric": ("hpolab.selection_metric", VER, "the metric the best trial was selected by"),
    "hpolab.serving_model_uri": ("hpolab.serving_model_uri", PROM, "the serving model's URI"),
    "hpolab.spec": ("hpolab.spec", SA, "the study's recorded spec"),
    "hpolab.spec_hash": ("hpolab.spec_hash", f"{SA}, {PR}", "hash of the recorded spec"),
    "hpolab.spec_version": ("hpolab.spec_version", f"{SA}, {PR}", "the number of accepted spec changes"),
    "hpolab.state": ("hpolab.state", f"{TR}, {MOD}", "the trial's state: RUNNING, PAUSED (a trial scheduler's), COMPLETE, PRUNED, FAIL"),
    "hpolab.state_repaired": ("hpolab.state_repaired", TR, "the state tag study check --repair replaced"),
    "hpolab.stop": ("hpolab.stop", SA, "why the study stopped early (stop_after_no_improvement, stop_when_converged)"),
    "hpolab.stop_reason": ("hpolab.stop_reason", f"{PR}, {TR}", "why the study (or the trial) stopped"),
    "hpolab.study": ("hpolab.study", VER, "the study the version comes from"),
    "hpolab.task": ("hpolab.task", f"{PROM}, {VER}", "classification, regression, multilabel or custom"),
    "hpolab.tell_error": ("hpolab.tell_error", TR, "telling Optuna the trial's result failed: why"),
    "hpolab.test_": ("hpolab.test_<metric>", VER, "the test-split metrics of the promotion gate"),
    "hpolab.test_fingerprint": ("hpolab.test_fingerprint", f"{PROM}, {VER}", "sha256 of the test split's inputs and labels"),
    "hpolab.torch_threads": ("hpolab.torch_threads", TR, "torch threads of the trial process"),
    "hpolab.torchscript_max_abs_diff": ("hpolab.torchscript_max_abs_diff", VER, "largest |TorchScript - PyTorch| on the test inputs"),
    "hpolab.trainer_overrides": ("hpolab.trainer_overrides", TR, "trainer values a retry changed (e.g. after an OOM)"),
    "hpolab.trial": ("hpolab.trial", TA, "the trial number (on a pruning companion trial)"),
    "hpolab.trial_model_uri": ("hpolab.trial_model_uri", VER, "the trial's own logged model"),
    "hpolab.trial_number": ("hpolab.trial_number", f"{MOD}, {VER}", "the trial's number"),
    "hpolab.trial_run_id": ("hpolab.trial_run_id", VER, "the trial run the version was promoted from"),
    "hpolab.trials_": ("hpolab.trials_<state>", PR, "the study's trial counts by state"),
    "hpolab.violated": ("hpolab.violated", TR, "constraints: the ones the trial breaks"),
    "hpolab.warm_start": ("hpolab.warm_start", f"{SA}, {PR}", "the warm start done (what was enqueued, imported)"),
    "hpolab.warm_start_from": ("hpolab.warm_start_from", f"{TA}, {TR}", "the earlier study's trial this configuration came from"),
    "hpolab.worker_seed": ("hpolab.worker_seed", TR, "the driver's seed"),
    "optuna.study": ("optuna.study", f"{TR}, {PR}, {PROM}, {LR}, {MOD}", "the study's name"),
    "optuna.trial_number": ("optuna.trial_number", f"{TR}, {PROM}", "the trial's number (a promote run: the trial promoted)"),
    "mlflow.note.content": ("mlflow.note.content", LR, "the LR range test's summary (MLflow's run description)"),
    "mlflow.parentRunId": ("mlflow.parentRunId", f"{TR}, {PROM}, {LR}", "the study's parent run (MLflow's nesting)"),
}

# Literals of these prefixes that are no MLflow/Optuna names: files, modules, Kubernetes labels.
NOT_NAMES = {"hpolab.cli", "mlflow.db", "optuna.db", "mlflow.pytorch", "mlflow.sql", "mlflow.store.db.utils",
             "mlflow.pyfunc", "mlflow.entities", "mlflow.tracking", "mlflow.exceptions", "optuna.storages",
             "optuna.trial", "optuna.samplers", "optuna.pruners", "mlflow.tracking._tracking_service.utils",
             "mlflow.pytorch._lightning_autolog"}

# Epoch metrics whose line in train/loop.py carries no comment.
EPOCH_NOTES = {"grad_norm_max": "largest global L2 norm of the gradients over the epoch's optimizer steps, before clipping"}

PARAMS = [
    "- A trial run's params are its full resolved config, flattened with dots: `seed`, `metric`, `direction`, "
    "`trainer.<key>` (every key of [`trainer`](spec.md)), `model.<key>` and `data.<key>` (the experiment's "
    "defaults with the spec's values and the sampled ones); several objectives add `objectives` and `cost_metrics`.",
    "- The parent run's params are the spec, flattened the same way, without `search_space` and `enqueue` "
    "(the run's `spec.yaml` artifact holds the whole spec); the LR range test adds its chosen bounds.",
    "- A trial's logged model carries its run's params.",
]

METRICS = [
    "- Per epoch, on each trial run: the metrics of the table below, with the task's `val_*` metrics (the "
    "study metric among them; classification: `val_acc`) after `val_loss`.",
    "- Once, after training, when objectives or constraints name them: the cost metrics of the table below "
    "and the experiment's own (`COSTS`).",
    "- While each trial runs (unless `system_metrics: false`), its processes' system metrics under MLflow's "
    "`system/` keys (the run page's System metrics tab), step = seconds since the run started: "
    "`system/cpu_utilization_percentage`, `system/system_memory_usage_megabytes`, `system/system_memory_usage_percentage`, "
    "`system/thread_count`, `system/peak_memory_megabytes`, `system/samples_per_second`, `system/data_wait_percentage`; "
    "on CUDA `system/gpu_0_memory_usage_megabytes`, `system/gpu_0_memory_usage_percentage`, "
    "`system/peak_gpu_0_memory_megabytes` (and `system/gpu_0_utilization_percentage` with nvidia-ml-py).",
    "- On the parent run: `best_<metric>`; several objectives: `hypervolume` per finished trial.",
    "- On a logged model: the run's metrics of the epoch its weights come from; on a serving model and the "
    "trial's model after promotion: the gate's `test_*` metrics.",
    "- On a promotion race's `race` run, per round (step = round), each candidate's (`trial_19`, `champion_v3`): "
    "`<candidate>.<metric>_mean`, `<candidate>.<metric>_ci95_low`, `<candidate>.<metric>_ci95_high`, `<candidate>.p_best` "
    "and `<candidate>.seeds`, and `noise_floor`; its seed runs are trial runs (the metrics above) named "
    "`race-<candidate>-seed-<seed>`.",
]


def _is_module_path(name: str) -> bool:
    parts = name.split(".")
    if parts[0] != "hpolab" or len(parts) < 3:
        return False
    target = PACKAGE.parent.joinpath(*parts)
    return target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()


def _bare_prefix(node: ast.JoinedStr) -> str | None:
    """'hpolab.' for f"hpolab.{x}" (a prefix and nothing else before the first value), else None."""
    first = node.values[0] if node.values else None
    if isinstance(first, ast.Constant) and re.fullmatch(r"(hpolab|optuna|mlflow)\.", str(first.value)) and len(node.values) > 1:
        return first.value
    return None


def written_names() -> dict[str, set[str]]:
    """Every `hpolab.*` / `optuna.*` / `mlflow.*` name in a string literal of the package -> its modules."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE.parent).with_suffix("").as_posix().replace("/", ".")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr) and _bare_prefix(node):  # f"hpolab.{metric}": a name made whole at run time
                found.setdefault(_bare_prefix(node), set()).add(module)
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            v = node.value
            if re.fullmatch(r"(hpolab|optuna|mlflow)\.[A-Za-z_][\w.]*", v) and v not in NOT_NAMES and not _is_module_path(v):
                found.setdefault(v, set()).add(module)
    return found


def epoch_metrics() -> list[tuple[str, str]]:
    """(name, meaning) of hpolab.train.loop.BASE_METRICS, read from its source (no torch import)."""
    src = (PACKAGE / "train" / "loop.py").read_text()
    body = re.search(r"^BASE_METRICS = \((.*?)^\)", src, re.S | re.M).group(1)
    return [(m.group(1), (m.group(2) or EPOCH_NOTES.get(m.group(1), "")).strip()) for m in re.finditer(r'^\s*"(\w+)",(?:\s*#\s*(.*))?$', body, re.M)]
