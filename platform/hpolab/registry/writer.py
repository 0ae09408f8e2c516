"""The writes of a promotion, after the gate and every check passed.

A run `promote-trial-<n>` nested under the study's parent run holds the serving model (an MLflow
LoggedModel, torch.export "pt2" format, raw-input signature; its pyfunc flavour answers with the task's
table, see hpolab_pyfunc), export/model.onnx,
export/model.torchscript.pt and the test metrics. A new version of the registered model is created
from that serving model, tagged with its lineage, and the alias moves to it. If anything fails on
the way the run is marked FAILED with the reason.

A model registered as it was logged (candidate.py: one its experiment scores itself) gets the same
promote run and lineage, and a version whose source is the trial's logged model.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from hpolab.registry.champion import TAG_TRIAL_RUN
from hpolab.registry.gate_objectives import TAG_OBJECTIVE
from hpolab.registry.evaluation import EXAMPLE_ROWS, Evaluation, Exports, PromotionFailed
from hpolab.registry.selection import Challenger, StudyInfo
from hpolab.stores.model_links import link_test_metrics, serving_model_name
from hpolab.stores.run_roles import PROMOTE, ROLE

SERVING_MODEL_NAME = "serving_model"  # the serving model's name before it was named after its version
EXPORT_DIR = "export"  # artifact folder of the promote run: model.onnx, model.torchscript.pt
MAX_TAG = 5000

# Version tags (lineage); plus serving.TAG_* (what predict needs) and the trial run's env.* tags.
TAG_STUDY = "hpolab.study"
TAG_TRIAL = "hpolab.trial_number"
TAG_PREVIOUS = "hpolab.previous_champion"
TAG_ONNX_DIFF = "hpolab.onnx_max_abs_diff"
TAG_TS_DIFF = "hpolab.torchscript_max_abs_diff"
TAG_GATE = "hpolab.gate_metric"
TAG_EXPORT_SKIPPED = "hpolab.export_skipped"  # why ONNX / TorchScript are missing (a logged model's exports may fail)


def move_alias_to_existing(client, model_name: str, alias: str, version: str, previous: str | None) -> None:
    """Idempotent promotion: the trial already has a version (with its exports); the alias moves to it."""
    client.set_model_version_tag(model_name, version, TAG_PREVIOUS, str(previous or "none"))
    client.set_registered_model_alias(model_name, alias, version)


def move_to_existing(client, model_name: str, alias: str, version: str, previous: str | None, trial: int, run_id: str,
                     dry: bool) -> int:
    """The challenger's trial already has a version (any experiment's promote): the alias moves to it,
    no new version and no exports; what happened (or would, `dry`) printed. Returns the exit code."""
    from hpolab.errors import EXIT_OK

    if dry:
        print(f"dry run: would move @{alias} to the existing version {version} of {model_name} "
              f"(trial {trial}, run {run_id}) from {previous or 'nobody'}; nothing was written")
        return EXIT_OK
    move_alias_to_existing(client, model_name, alias, version, previous)
    print(f"{model_name} version {version} already holds trial {trial} (run {run_id}): "
          f"no new version; @{alias} -> version {version}" + (f" (was version {previous})" if previous else ""))
    return EXIT_OK


def write_version(client, model_name: str, alias: str, info: StudyInfo, ch: Challenger, test: dict, gate: str | None,
                  selection_metric: str, exported: tuple[Exports | None, str | None], previous: str | None, *,
                  ev: Evaluation | None = None, logged: tuple[str, dict] | None = None) -> str:
    """Promote run + exports + a new registered version holding `alias`; returns the version. Its model:
    `ev`'s serving model (a task's evaluation), logged here with what predict needs, else `logged`: the
    trial's logged model (its URI, what the caller knows of it), registered as it is. `exported`:
    (the exports, or why they were skipped)."""
    from hpolab.stores import mlflow_runs as tr

    exports = exported[0]
    run_id = _create_promote_run(client, model_name, info, ch)
    try:
        for f in (exports.onnx, exports.torchscript) if exports is not None else ():
            client.log_artifact(run_id, str(f), EXPORT_DIR)
        if ev is not None:
            served, known = _log_served(client, run_id, model_name, info, ch, ev, exports)
            source, model_id, source_run = served.model_uri, served.model_id, run_id
            trial_uri, about = ch.run_tags.get("hpolab.model_uri", ""), f"{info.metric} {ch.val_value:.4f}"
        else:
            (source, known), source_run, trial_uri, about = logged, ch.run_id, logged[0], "its logged model"
            model_id = source.removeprefix("models:/") if source.startswith("models:/m-") else None
            if test:
                tr.log_epoch(client, run_id, 0, {f"test_{k.removeprefix('test_')}": v for k, v in test.items()})
        lineage = _lineage(info, ch, test, gate, selection_metric, previous, run_id, exported, trial_uri, known)
        gate_text = f"{lineage[TAG_GATE]} {test[gate]:.4f}" if gate else "no gate"
        version = _register(client, model_name, info, source, source_run, model_id, lineage,
                            f"study {info.name}, trial {ch.trial_number}: {about}, {gate_text}")
        if ev is not None:  # another promote may have registered a version meanwhile: the model then says which it is
            client.set_logged_model_tags(model_id, {"hpolab.registered_version": version})
        client.set_registered_model_alias(model_name, alias, version)
        tr.set_tags(client, run_id, {"hpolab.registered_version": version, "hpolab.serving_model_uri": source})
        client.set_terminated(run_id, status="FINISHED")
        return version
    except BaseException as e:
        tr.close_failed(client, run_id, e)
        raise


def _log_served(client, run_id: str, model_name: str, info: StudyInfo, ch: Challenger, ev: Evaluation, exports: Exports):
    """(the serving model logged on the promote run, its serving tags); the test metrics and parities logged too."""
    from hpolab.registry.serving import serving_tags
    from hpolab.stores import mlflow_runs as tr

    threshold = getattr(ev.bound, "threshold", None)
    s_tags = serving_tags(info.experiment, ev.x_raw, ev.y, ev.num_classes, ev.class_names, ev.bound.task.name, threshold)
    # Named after the version it becomes (a logged model cannot be renamed): the registry's next one.
    name = serving_model_name(model_name, next_version(client, model_name))
    m_tags = {**s_tags, "optuna.study": info.name, TAG_TRIAL: str(ch.trial_number), "hpolab.registered_model": model_name}
    served, served_diff = _log_serving_model(client, run_id, ev, ch.run_tags, m_tags, name)
    tests = {f"test_{k}": v for k, v in ev.metrics.items() if k != "n"}
    # the gate's test metrics, linked to the serving model and to the trial's own logged model
    link_test_metrics(client, run_id, [served.model_id, *_trial_model(client, ch.run_tags)], tests, ev.fingerprint)
    metrics = {"onnx_max_abs_diff": exports.onnx_diff, "torchscript_max_abs_diff": exports.torchscript_diff,
               "serving_max_abs_diff": served_diff}
    if ch.val_value is not None:
        metrics[info.metric] = ch.val_value
    tr.log_epoch(client, run_id, 0, metrics)
    return served, s_tags


def _create_promote_run(client, model_name: str, info: StudyInfo, ch: Challenger) -> str:
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

    from hpolab.stores.environment import capture_environment

    env = capture_environment(Path.cwd())
    run_name = f"promote-trial-{ch.trial_number}"
    run = client.create_run(
        info.experiment_id,
        run_name=run_name,
        tags={
            MLFLOW_PARENT_RUN_ID: info.parent_run_id,
            MLFLOW_RUN_NAME: run_name,
            ROLE: PROMOTE,  # not a trial run, though it names the trial it promotes (run_roles.py)
            "optuna.study": info.name,
            "optuna.trial_number": str(ch.trial_number),
            TAG_TRIAL_RUN: ch.run_id,
            "hpolab.registered_model": model_name,
            **env,
        },
    )
    return run.info.run_id


def next_version(client, model_name: str) -> int:
    """The version number the registry gives the next version of `model_name` (1 for a new model)."""
    from mlflow.exceptions import MlflowException

    try:
        latest = client.search_model_versions(f"name = '{model_name}'", max_results=1, order_by=["version_number DESC"])
    except MlflowException:
        return 1
    return int(latest[0].version) + 1 if latest else 1


def _trial_model(client, run_tags: dict[str, str]) -> list[str]:
    """The promoted trial's own logged model id, when it still exists."""
    model_id = run_tags.get("hpolab.model_id")
    if not model_id or "hpolab.model_deleted" in run_tags:
        return []
    try:
        client.get_logged_model(model_id)
    except Exception:
        return []
    return [model_id]


def _log_serving_model(client, run_id: str, ev: Evaluation, trial_tags: dict[str, str], s_tags: dict[str, str],
                       name: str = SERVING_MODEL_NAME):
    """(the LoggedModel, max abs logit difference of the logged artifact vs the evaluated model).

    Two flavours over one torch.export'ed file: `pytorch` (mlflow.pytorch.load_model: the raw network
    outputs, which promote compares champions on) and `python_function` through hpolab_pyfunc (copied
    into the model), whose predict returns the task's table: class + label + probabilities, ..."""
    import mlflow.pytorch
    import torch
    from mlflow.models import Model, infer_signature

    from hpolab.registry import hpolab_pyfunc
    from hpolab.registry.serving import predict_logits
    from hpolab.stores.models import new_run_model, pip_requirements

    example = ev.x_raw[:EXAMPLE_ROWS]
    config = _pyfunc_config(ev)
    table = hpolab_pyfunc.output_frame(config[hpolab_pyfunc.TASK], ev.logits[:EXAMPLE_ROWS], ev.class_names,
                                       config.get(hpolab_pyfunc.THRESHOLD, 0.5))
    with warnings.catch_warnings():  # "integer columns cannot hold missing values": class and 0/1 labels never miss
        warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer")
        signature = infer_signature(example, table)  # raw tensor in; the task's columns out
    logged = Model.log(
        artifact_path=None,
        name=name,
        flavor=_ServingFlavor(config),
        # created in the run's (the study's) experiment: log_model alone files it under "Default"
        model_id=new_run_model(client, run_id, name, s_tags).model_id,
        run_id=run_id,
        pytorch_model=ev.serving,
        input_example=example,
        signature=signature,
        code_paths=[hpolab_pyfunc.__file__],
        pip_requirements=[*pip_requirements(trial_tags), *_pandas_pin()],  # pinned to what trained it
    )
    # The registered artifact (torch.export "pt2") must predict exactly what we evaluated.
    served = predict_logits(mlflow.pytorch.load_model(logged.model_uri, map_location="cpu"), ev.x_raw)
    same = torch.equal(served.argmax(1), ev.logits.argmax(1)) if ev.bound.task.name == "classification" else \
        bool(torch.allclose(served, ev.logits, rtol=1e-4, atol=1e-4))
    if not same:
        raise PromotionFailed("the logged serving model's predictions differ from the evaluated model's; nothing was registered")
    return logged, float((served - ev.logits).abs().max())


def _pyfunc_config(ev: Evaluation) -> dict:
    """The pyfunc flavour's model_config: what hpolab_pyfunc needs to shape the outputs."""
    from hpolab.registry import hpolab_pyfunc as hp

    config = {hp.TASK: ev.bound.task.name, hp.CLASS_NAMES: [str(c) for c in ev.class_names]}  # numpy str_ would not go to YAML
    threshold = getattr(ev.bound, "threshold", None)
    if threshold is not None:
        config[hp.THRESHOLD] = float(threshold)
    return config


def _pandas_pin() -> list[str]:
    from importlib import metadata

    return [f"pandas=={metadata.version('pandas')}"]  # hpolab_pyfunc returns DataFrames


class _ServingFlavor:
    """mlflow.pytorch's save_model, then the pyfunc flavour loads through hpolab_pyfunc (in the model's code/)
    with `config` as its model_config. Model.log calls save_model and uploads the folder."""

    __name__ = "mlflow.pytorch"

    def __init__(self, config: dict):
        self.config = config

    def save_model(self, path: str, mlflow_model, **kwargs) -> None:
        import mlflow.pytorch
        from mlflow.models.model import MODEL_CONFIG  # "config": handed to _load_pyfunc as model_config

        mlflow.pytorch.save_model(path=path, mlflow_model=mlflow_model, **kwargs)
        pyfunc = mlflow_model.flavors["python_function"]
        pyfunc["loader_module"] = "hpolab_pyfunc"
        pyfunc[MODEL_CONFIG] = {**pyfunc.get(MODEL_CONFIG, {}), **self.config}
        mlflow_model.save(str(Path(path) / "MLmodel"))


def _lineage(info: StudyInfo, ch: Challenger, test: dict, gate: str | None, selection_metric: str, previous: str | None,
             run_id: str, exported: tuple[Exports | None, str | None], trial_model_uri: str, known: dict) -> dict[str, str]:
    """The version's tags: what it was promoted from, its test metrics, its exports (or why not), and
    `known`: what predict needs to know of the model (serving.serving_tags, or what candidate.Logged knows)."""
    exports, skipped = exported
    config = ch.config
    lineage = {
        TAG_STUDY: info.name,
        TAG_TRIAL: str(ch.trial_number),
        TAG_TRIAL_RUN: ch.run_id,
        "hpolab.promote_run_id": run_id,
        "hpolab.selection_metric": selection_metric,
        **({"hpolab.pick": ch.why} if ch.why else {}),  # several objectives: the rule and why this trial
        **{TAG_OBJECTIVE + k: repr(v) for k, v in ch.gate_values.items()},  # ... and each objective's gate value
        **({"hpolab.gate": "every objective: " + ", ".join(ch.gate_values)} if ch.gate_values else {}),
        f"hpolab.{info.metric}": repr(ch.val_value),
        # test_<x> whether or not an evaluate() named it test_
        **{f"hpolab.test_{k.removeprefix('test_')}": repr(v) for k, v in test.items()},
        TAG_GATE: f"test_{gate.removeprefix('test_')}" if gate else "none",  # none: --force registered it ungated
        TAG_PREVIOUS: str(previous or "none"),
        **({"hpolab.seed": str(config["seed"])} if "seed" in config else {}),
        **({"hpolab.data": json.dumps(config["data"], sort_keys=True)} if "data" in config else {}),
        **({"hpolab.model_config": json.dumps(config["model"], sort_keys=True)} if "model" in config else {}),
        "hpolab.trial_model_uri": trial_model_uri,
        **{k: v for k, v in ch.run_tags.items() if k.startswith("env.")},  # what trained it
    }
    if exports is not None:
        lineage.update({TAG_ONNX_DIFF: repr(exports.onnx_diff), "hpolab.onnx_exporter": exports.exporter,
                        TAG_TS_DIFF: repr(exports.torchscript_diff), "hpolab.export_onnx": f"{EXPORT_DIR}/{exports.onnx.name}",
                        "hpolab.export_torchscript": f"{EXPORT_DIR}/{exports.torchscript.name}"})
    else:
        lineage[TAG_EXPORT_SKIPPED] = skipped or "unknown"
        print(f"exports skipped: {lineage[TAG_EXPORT_SKIPPED]}", file=sys.stderr)
    return {k: str(v)[:MAX_TAG] for k, v in {**lineage, **known}.items()}


def _register(client, model_name: str, info: StudyInfo, source: str, run_id: str, model_id: str | None, tags: dict[str, str],
              description: str) -> str:
    """A new version of `model_name` (created on first use) from the model at `source`."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(model_name, description=f"hpolab: promoted from study {info.name}" if model_name == info.name else None)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    mv = client.create_model_version(model_name, source=source, run_id=run_id, tags=tags, model_id=model_id, description=description)
    return str(mv.version)
