"""The challenger: the study's best COMPLETE trial by a metric, its MLflow run, and its best checkpoint
rebuilt into a model wrapped with the experiment's preprocessing.

Pruned and failed trials are never candidates. By default the study's own metric and direction
decide (the trial's value); `--metric` picks another logged metric, read at each trial's
best-checkpoint epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpolab.stores.paths import Stores
from hpolab.study.objectives.ranking import feasible, primary_direction


@dataclass
class Challenger:
    trial_number: int
    run_id: str
    selection_value: float
    val_value: float | None  # the study metric on val at the best checkpoint
    config: dict[str, Any] = field(default_factory=dict)
    run_tags: dict[str, str] = field(default_factory=dict)
    why: str = ""  # several objectives: the rule and why this trial won (recorded on the version)
    values: dict[str, float] = field(default_factory=dict)  # several objectives: the trial's recorded values
    bounds: tuple = ()  # several objectives: the --pick rule's bounds, checked again on the test split
    gate_values: dict[str, float] = field(default_factory=dict)  # several objectives: what the gate compared
    race: Any = None  # (RaceResult, the winner's label, the seed of this run) when a promotion race chose it


@dataclass
class StudyInfo:
    name: str
    experiment: str
    metric: str
    direction: str
    parent_run_id: str
    experiment_id: str
    objectives: list[str] = field(default_factory=list)  # several objectives: their metrics, in order


def load_study(name: str, stores: Stores, client):
    """(the Optuna study, StudyInfo from it and its MLflow parent run); UserError when either is missing."""
    from hpolab.errors import UserError
    from hpolab.stores.optuna_storage import load_study as load_optuna_study

    study = load_optuna_study(name, stores)  # UserError when unknown
    parent_id = study.user_attrs.get("mlflow_parent_run_id")
    try:
        parent = client.get_run(parent_id) if parent_id else None
    except Exception:
        parent = None
    if parent is None:
        raise UserError(f"study {name!r} has no MLflow parent run in {stores.tracking_shown}; is --tracking-uri the one the study used?")
    p = parent.data.params
    metric = p.get("metric", "val_acc")  # several objectives: the one pruned on (the best checkpoint's)
    info = StudyInfo(
        name=name,
        experiment=p.get("experiment", ""),
        metric=metric,
        direction=primary_direction(study, metric),
        parent_run_id=parent_id,
        experiment_id=parent.info.experiment_id,
        objectives=list(study.metric_names or []) if len(study.directions) > 1 else [],
    )
    if not info.experiment:
        raise UserError(f"the parent run of study {info.name!r} does not record its experiment (param 'experiment')")
    return study, info


def selection_metric(metric_option: str | None, info: StudyInfo) -> tuple[str, str]:
    """(metric, direction) to pick the challenger by: the study's, or `--metric` with a direction read from its name."""
    from hpolab.errors import UserError

    metric = metric_option or info.metric
    if metric == info.metric:
        return metric, info.direction
    name = metric.lower()
    if any(k in name for k in ("loss", "err", "rmse", "mae", "mse")):
        return metric, "minimize"
    if any(k in name for k in ("acc", "f1", "recall", "precision", "auc", "r2", "map")):
        return metric, "maximize"
    raise UserError(f"--metric {metric}: cannot tell whether it should be maximized or minimized; use a *_loss, *_rmse, *_acc, *_f1 or *_map metric")


def pick(client, study, info: StudyInfo, metric: str, direction: str) -> Challenger:
    """The best COMPLETE trial with an MLflow run by `metric`; prints the trial counts and the pick."""
    from optuna.trial import TrialState

    from hpolab.errors import UserError

    trials = study.get_trials(deepcopy=False)
    states = {s: sum(t.state == s for t in trials) for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    # (a trial that broke a constraint is no candidate, as for Optuna's best_trial)
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("mlflow_run_id") and feasible(t)]
    print(
        f"study {info.name} ({info.experiment}): {states[TrialState.COMPLETE]} complete, "
        f"{states[TrialState.PRUNED]} pruned, {states[TrialState.FAIL]} failed trials (only complete ones are candidates)"
    )
    if not complete:
        raise UserError(f"study {info.name!r} has no COMPLETE trial to promote; run it first (hpolab study run ...)")
    candidates: list[Challenger] = []
    logged: set[str] = set()
    for t in complete:
        run_id = t.user_attrs["mlflow_run_id"]
        if metric == info.metric:
            value = t.value
        else:
            value, names = _metric_at_best_epoch(client, run_id, metric)
            logged |= names
        if value is None or value != value:  # missing or NaN
            continue
        candidates.append(Challenger(t.number, run_id, float(value), t.value))
    if not candidates:
        known = ", ".join(sorted(logged)) or "none"
        raise UserError(f"--metric {metric}: no COMPLETE trial of {info.name!r} logged it (logged metrics: {known})")
    if metric == info.metric:  # the study's ranking (ranking.py): a tie on the value goes to the lower validation loss
        from hpolab.study.objectives import ranking

        order = {t.number: i for i, t in enumerate(ranking.ranked(complete, [direction]))}
        best = min(candidates, key=lambda c: order.get(c.trial_number, len(order)))
        tie = ranking.tie_note(complete, [direction])
    else:
        best, tie = (max if direction == "maximize" else min)(candidates, key=lambda c: c.selection_value), None
    how = "" if metric == info.metric else " at each trial's best-checkpoint epoch"
    print(f"best by {metric} ({direction}{how}): trial {best.trial_number} (run {best.run_id}), {metric} = {best.selection_value:.4f}"
          + (f" ({tie})" if tie else ""))
    return best


def pick_on_front(study, info: StudyInfo, rule: str | None) -> Challenger:
    """Several objectives: the trial --pick's rule chooses from the feasible front, else its knee (pick.py)."""
    from hpolab.registry.pick import parse_rule, pick_from_front, values_of

    t, why = pick_from_front(study, info.objectives, rule)
    values = values_of(t, info.objectives)
    value = values.get(info.metric)
    print(f"study {info.name} ({info.experiment}): chosen by {why}")
    return Challenger(t.number, t.user_attrs["mlflow_run_id"], float(value), value, why=why, values=values,
                      bounds=parse_rule(rule or "", list(values)).bounds)


def _metric_at_best_epoch(client, run_id: str, metric: str) -> tuple[float | None, set[str]]:
    run = client.get_run(run_id)
    names = set(run.data.metrics)
    if metric not in names:
        return None, names
    history = client.get_metric_history(run_id, metric)
    best_epoch = run.data.tags.get("hpolab.best_epoch")
    at = [m.value for m in history if best_epoch is not None and str(m.step) == best_epoch]
    return (at[-1] if at else run.data.metrics[metric]), names


def load_challenger(client, stores: Stores, info: StudyInfo, ch: Challenger, tmp: Path, exp=None):
    """(experiment, splits, model, serving model, bound task) from the trial's config.yaml and
    checkpoints/best.pt (without it, the model the trial logged: the same weights); fills ch.config and ch.run_tags. The task is bound to the data as in training
    (target standardisation from the train split), so serving returns values in the target's units.
    `exp`: the experiment module when the caller already found it (challenger_experiment)."""
    import torch
    import mlflow.artifacts
    import yaml

    from hpolab.errors import UserError
    from hpolab.registry.serving import ServingModel
    from hpolab.train import load_checkpoint, load_model_state
    from hpolab.train.config import trainer_config
    from hpolab.train.data import data_seed_of
    from hpolab.train.tasks import task_for

    run = client.get_run(ch.run_id)
    ch.run_tags = dict(run.data.tags)

    def fetch(path: str) -> Path:
        try:
            return Path(mlflow.artifacts.download_artifacts(run_id=ch.run_id, artifact_path=path, dst_path=str(tmp), tracking_uri=stores.tracking_uri))
        except Exception as e:
            raise UserError(f"trial {ch.trial_number} (run {ch.run_id}) has no artifact {path}: {e}") from e

    ch.config = yaml.safe_load(fetch("config.yaml").read_text())
    exp = exp or challenger_experiment(client, info, ch, run)
    splits = exp.load_data(ch.config["data"], data_seed_of(ch.config))
    try:
        best = fetch("checkpoints/best.pt")
    except UserError as missing:  # retention removed it: the model the trial logged from it, if it kept one
        try:
            uri = trial_model_uri(client, ch)
        except UserError:
            raise missing from None
        model = load_logged(uri, f"trial {ch.trial_number}'s logged model {uri}")
    else:
        model = exp.build_model(ch.config["model"], tuple(splits.input_shape), splits.num_classes)
        load_model_state(model, load_checkpoint(best, map_location="cpu")["state"]["model"])
        model.eval()
    bound = task_for(exp).bind(trainer_config(ch.config["trainer"]), splits, torch.device("cpu"))
    return exp, splits, model, ServingModel(splits.preprocess, model, bound.head()).eval(), bound


def challenger_experiment(client, info: StudyInfo, ch: Challenger, run):
    """The experiment module for the challenger: the importable one (a warning when its code differs
    from what the trial ran), else the code the trial's run (or the study's parent run) recorded."""
    import sys

    from hpolab.stores.code_artifacts import experiment_for_runs

    def parent():
        try:
            return client.get_run(info.parent_run_id)
        except Exception:  # noqa: BLE001 -- the trial's own run decides then
            return None

    runs = [run] if run.data.tags.get("hpolab.code_hash") else [run, parent()]
    found = experiment_for_runs(client, runs, info.experiment)
    if found.here is None:
        print(f"experiment {info.experiment}: not importable here; using the code {found.recorded_by} recorded "
              f"(hash {found.recorded_hash})")
    elif found.differs:
        from hpolab.config.experiment_code import mismatch

        print(f"hpolab: warning: {mismatch(info.experiment, found.here, found.recorded_hash, f'trial {ch.trial_number}')}; "
              "promoting with the module here (its model must load the trial's checkpoint)", file=sys.stderr)
    return found.module


def trial_model_uri(client, ch) -> str:
    """The trial run's logged model (tag hpolab.model_uri, else the run's logged model named "model")."""
    from hpolab.errors import UserError

    uri = ch.run_tags.get("hpolab.model_uri")
    if uri and "hpolab.model_deleted" not in ch.run_tags:
        return uri
    run = client.get_run(ch.run_id)
    models = [m for m in client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{ch.run_id}'")
              if m.name == "model"]
    if models:
        return f"models:/{models[0].model_id}"
    why = ch.run_tags.get("hpolab.model_skipped") or ch.run_tags.get("hpolab.model_error") or ch.run_tags.get("hpolab.model_deleted")
    raise UserError(f"trial {ch.trial_number} (run {ch.run_id}) has no logged model"
                    + (f" ({why})" if why else "") + ": the experiment's train() must call trial.log_model(model, "
                    "input_example) and the study keep models (log_models)")


def load_logged(uri: str, what: str):
    """A logged model as a module in eval mode; UserError when its code does not import here."""
    import mlflow.pytorch

    from hpolab.errors import UserError
    from hpolab.registry.evaluation import PromotionFailed
    from hpolab.registry.exported_module import as_module

    try:
        model = mlflow.pytorch.load_model(uri, map_location="cpu")
    except ModuleNotFoundError as e:
        raise UserError(f"{what} needs module {e.name!r} to load (its classes were pickled with it); run promote "
                        "where the experiment's code imports") from e
    except Exception as e:  # noqa: BLE001
        raise PromotionFailed(f"loading {what} failed: {type(e).__name__}: {e}") from e
    return as_module(model)  # the pt2 format's graph module cannot switch to eval(): evaluate() may call it
