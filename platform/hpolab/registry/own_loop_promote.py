"""`hpolab promote` for an own-loop experiment (`train(config, trial)`): the trial's logged model, gated by
the experiment's `evaluate(model, "test")`.

The routine's promote rebuilds the model from checkpoints/best.pt with the experiment's build_model and
scores it through the task. An own loop has neither: its model is the one `trial.log_model` logged, and
only the experiment knows its held-out split and metrics. So:

1. The challenger (picked as for any study) is the trial run's logged MLflow model, loaded as it is
   (mlflow.pytorch.load_model on its models:/ URI), not rebuilt. No logged model: exit 2 (train() must
   call trial.log_model and the study keep models: log_models).
2. `evaluate(model, "test")` scores it; gate.py says which returned metric gates and in which
   direction, as for the routine. The alias holder is evaluated the same way when it was promoted through the same
   experiment's evaluate() (tag hpolab.gate_source = evaluate), else it is not comparable (exit 3
   unless --force, as for the routine). Without `evaluate`: exit 2 with one line saying to define it;
   `--force` then registers the trial's logged model ungated (what `mlflow.register_model` would do),
   and the version records that no gate ran (hpolab.gate_metric = none).
3. ONNX and TorchScript exports of that model from its logged input example, with the same parity
   checks; where one fails it is skipped and the reason recorded (tag hpolab.export_skipped), the
   promotion goes on (the model's own flavour is what is registered).
4. Writes: a run `promote-trial-<n>` under the study's parent run (exports, test metrics; retention
   keeps the trial's files because this run names it) and a new version of the registered model whose
   source is the trial's logged model; the alias moves to it. Its tags tell `hpolab predict` the raw
   input (the input example's shape and dtype) and the task "custom": predict prints the model's raw
   outputs as columns output_<j>.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from hpolab.errors import EXIT_OK, UserError
from hpolab.registry import gate
from hpolab.registry.champion import TAG_TRIAL_RUN
from hpolab.registry.evaluation import PromotionFailed

TAG_GATE_SOURCE = "hpolab.gate_source"  # on a version: "evaluate" (own loop) -- what its test metrics mean
TAG_EXPORT_SKIPPED = "hpolab.export_skipped"  # on a version: why ONNX / TorchScript are missing
EVALUATE = "evaluate"


def is_own_loop(experiment) -> bool:
    """An own-loop experiment defines train(config, trial) and no build_model (config.experiment's rule)."""
    from hpolab.config.experiment import is_own_loop as own

    return own(experiment)


def promote_own_loop(args, client, info, ch, exp, holder, existing, contest, tmp: Path) -> int:
    """Steps 1-4 of the module docstring; returns the exit code."""
    model_name, alias, force, dry = contest.model, contest.alias, bool(args.force), bool(args.dry_run)
    evaluate = getattr(exp, EVALUATE, None)
    if not callable(evaluate) and not force:
        raise UserError(f"experiment {info.experiment} has no evaluate(model, split): define it (returning e.g. "
                        f"{{{gate.candidates(info.metric)[0]!r}: ...}} for split \"test\") so promote can gate on "
                        "held-out data, or pass --force to register the trial's logged model ungated")
    ch.run_tags = dict(client.get_run(ch.run_id).data.tags)
    ch.config = _trial_config(client, ch, tmp)
    uri = trial_model_uri(client, ch)
    model = _load(uri, f"trial {ch.trial_number}'s logged model {uri}")
    test, held, directions, gate_name = {}, None, {}, None
    if callable(evaluate):
        test = _evaluate(evaluate, model, info)
        gate_name = gate.gate_metric(info.metric, test)
        directions = gate.directions(test, gate_name, getattr(exp, "METRIC_DIRECTIONS", None), info.direction)
        why_not = None
        if holder is not None:
            held, why_not = _evaluate_holder(holder, model_name, info, evaluate, gate_name)
        _print_table(ch, info, test, alias, holder, held)
        from dataclasses import replace

        decision = gate.decide(test, held, gate_name, force, replace(contest, not_comparable=why_not), directions,
                               prefix="" if gate_name.startswith("test_") else "test ")
    else:
        decision = gate.Decision(gate.PROMOTE, f"experiment {info.experiment} has no evaluate(model, split): "
                                               "--force registers the trial's logged model ungated (no test metrics)")
    print(decision.reason)
    if not decision.promote:
        return decision.exit_code
    previous = holder.version if holder is not None else None
    if existing is not None:  # (as for the routine: writer.py)
        from hpolab.registry.writer import move_to_existing

        return move_to_existing(client, model_name, alias, existing.version, previous, ch.trial_number, ch.run_id, dry)
    example = _input_example(uri, tmp)
    exports, skipped = export_or_skip(model, example, tmp)
    if dry:
        print(f"dry run: would register the logged model of trial {ch.trial_number} (run {ch.run_id}) as a new version of "
              f"{model_name} and move @{alias} to it (from {previous or 'nobody'}); nothing was written")
        return EXIT_OK
    version = _write(client, info, ch, uri, test, gate_name, exports, skipped, example, previous, contest)
    print(f"registered {model_name} version {version} (trial {ch.trial_number}'s logged model); @{alias} -> version {version}"
          + (f" (was version {previous})" if previous else ""))
    predict = f"predict models:/{model_name}@{alias} INPUT.npy"
    print(f'load it: mlflow.pytorch.load_model("models:/{model_name}@{alias}")  '
          f"or  {args.stores.command(predict) if getattr(args, 'stores', None) else 'hpolab ' + predict}  (inputs as the model takes them)")
    return EXIT_OK


def test_name(name: str) -> str:
    """A name evaluate(model, "test") returned, as recorded (tags, the promote run's metrics): test_<x>."""
    return name if name.startswith("test_") else f"test_{name}"


def trial_model_uri(client, ch) -> str:
    """The trial run's logged model (tag hpolab.model_uri, else the run's logged model named "model")."""
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


def _trial_config(client, ch, tmp: Path) -> dict:
    """The trial's resolved config (config.yaml of its run): lineage tags only; {} when it is missing."""
    import mlflow.artifacts
    import yaml

    try:
        path = mlflow.artifacts.download_artifacts(run_id=ch.run_id, artifact_path="config.yaml", dst_path=str(tmp / "config"))
        return yaml.safe_load(Path(path).read_text()) or {}
    except Exception:  # noqa: BLE001 -- lineage only
        return {}


def _load(uri: str, what: str):
    import mlflow.pytorch

    try:
        model = mlflow.pytorch.load_model(uri, map_location="cpu")
    except ModuleNotFoundError as e:
        raise UserError(f"{what} needs module {e.name!r} to load (its classes were pickled with it); run promote "
                        "where the experiment's code imports") from e
    except Exception as e:  # noqa: BLE001
        raise PromotionFailed(f"loading {what} failed: {type(e).__name__}: {e}") from e
    from hpolab.registry.exported_module import as_module

    return as_module(model)  # the pt2 format's graph module cannot switch to eval(): evaluate() may call it


def _evaluate(evaluate, model, info) -> dict[str, float]:
    import torch

    try:
        with torch.inference_mode():
            returned = evaluate(model, "test")
    except Exception as e:  # noqa: BLE001 -- the experiment's code: its error, one line
        raise PromotionFailed(f"experiment {info.experiment}: evaluate(model, \"test\") raised {type(e).__name__}: {e}") from e
    return gate.checked_metrics(returned, info.experiment, info.metric)


def _evaluate_holder(holder, model_name: str, info, evaluate, gate_name: str):
    """(the holder's metrics, None) or (None, why it cannot be compared)."""
    from hpolab.registry.serving import TAG_EXPERIMENT

    tags = holder.tags
    if tags.get(TAG_GATE_SOURCE) != EVALUATE or tags.get(TAG_EXPERIMENT) != info.experiment:
        return None, (f"it was not scored by experiment {info.experiment}'s evaluate() (experiment "
                      f"{tags.get(TAG_EXPERIMENT, 'unknown')}, gate {tags.get(TAG_GATE_SOURCE, 'the routine test split')})")
    try:
        held = _evaluate(evaluate, _load(f"models:/{model_name}/{holder.version}", f"version {holder.version}"), info)
    except (UserError, PromotionFailed) as e:
        return None, str(e)
    return (held, None) if gate_name in held else (None, f"its evaluate() result lacks {gate_name}")


def _input_example(uri: str, tmp: Path) -> np.ndarray | None:
    """The logged model's input example (what trial.log_model was given), or None."""
    import mlflow.artifacts
    from mlflow.models import Model

    try:
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp / "trial_model"))
        example = Model.load(local).load_input_example(local)
    except Exception:  # noqa: BLE001 -- no example: no exports, no predict tags
        return None
    return None if example is None else np.asarray(example)


def export_or_skip(model, example: np.ndarray | None, folder: Path):
    """(Exports or None, the reason they were skipped or None): ONNX + TorchScript from the input example,
    each checked against PyTorch on it (export.py's tolerances)."""
    import torch

    from hpolab.registry.evaluation import Exports
    from hpolab.registry.export import (ONNX_TOLERANCE, export_onnx, export_torchscript, onnx_max_abs_diff,
                                        torchscript_max_abs_diff)

    if example is None or example.dtype == object:
        return None, "the logged model has no array input example"
    if not isinstance(model, torch.nn.Module):
        return None, f"the logged model loads as {type(model).__name__}, not a torch.nn.Module"
    x = np.ascontiguousarray(example)
    try:
        with torch.inference_mode():
            reference = model(torch.from_numpy(x)).float().numpy()
        onnx_path, exporter = export_onnx(model, torch.from_numpy(x), folder / "model.onnx")
        onnx_diff = onnx_max_abs_diff(onnx_path, x, reference)
        ts_path = export_torchscript(model, torch.from_numpy(x), folder / "model.torchscript.pt")
        ts_diff = torchscript_max_abs_diff(ts_path, x, reference)
    except Exception as e:  # noqa: BLE001 -- an own model may not export: recorded, not fatal
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
    limit = ONNX_TOLERANCE * max(1.0, float(np.abs(reference).max()))
    print(f"exports: ONNX ({exporter} exporter) max abs diff vs PyTorch {onnx_diff:.3g} on the input example "
          f"(limit {limit:.3g}); TorchScript {ts_diff:.3g}")
    if not onnx_diff <= limit:
        return None, f"ONNX parity: {onnx_diff:.3g} > {limit:.3g} on the input example"
    return Exports(onnx_path, ts_path, exporter, onnx_diff, ts_diff), None


def _print_table(ch, info, test: dict, alias: str, holder, held) -> None:
    names = list(test)
    print(f"held-out test split: the experiment's evaluate(model, \"test\") (gate: {gate.gate_metric(info.metric, test)})")
    # the trial's value of the study metric, then evaluate()'s test metrics ("test " before each when a name is the study metric's)
    shown = [f"test {k}" for k in names] if info.metric in names else names
    print(f"  {'':28s} {info.metric:>10s} " + " ".join(f"{k:>12s}" for k in shown))
    rows = [(f"challenger: trial {ch.trial_number}", ch.val_value, test)]
    if holder is not None:
        val = holder.tags.get(f"hpolab.{info.metric}")
        rows.append((f"{alias}: version {holder.version}", float(val) if val not in (None, "None") else None, held))
    for label, val, m in rows:
        cells = " ".join(f"{(f'{m[k]:.4f}' if m and k in m else '-'):>12s}" for k in names)
        print(f"  {label:28s} {('-' if val is None else f'{val:.4f}'):>10s} {cells}")


def _write(client, info, ch, uri: str, test: dict, gate_name, exports, skipped, example, previous, contest) -> str:
    """The promote run (exports, test metrics) and a new registered version of the trial's logged model."""
    from hpolab.registry import writer
    from hpolab.stores import mlflow_runs as tr

    run_id = writer._create_promote_run(client, contest.model, info, ch)
    try:
        if exports is not None:
            for f in (exports.onnx, exports.torchscript):
                client.log_artifact(run_id, str(f), writer.EXPORT_DIR)
        if test:
            tr.log_epoch(client, run_id, 0, {test_name(k): v for k, v in test.items()})
        tags = _version_tags(info, ch, uri, test, gate_name, exports, skipped, example, previous, run_id)
        mv = _register(client, contest.model, info, ch, uri, tags)
        client.set_registered_model_alias(contest.model, contest.alias, mv)
        tr.set_tags(client, run_id, {"hpolab.registered_version": mv, "hpolab.serving_model_uri": uri})
        client.set_terminated(run_id, status="FINISHED")
        return mv
    except BaseException as e:
        tr.close_failed(client, run_id, e)
        raise


def _version_tags(info, ch, uri, test, gate_name, exports, skipped, example, previous, run_id) -> dict[str, str]:
    from hpolab.registry import writer
    from hpolab.registry.serving import TAG_EXPERIMENT, TAG_RAW_DTYPE, TAG_RAW_SHAPE, TAG_TASK

    tags = {
        writer.TAG_STUDY: info.name, writer.TAG_TRIAL: str(ch.trial_number), TAG_TRIAL_RUN: ch.run_id,
        "hpolab.promote_run_id": run_id, "hpolab.selection_metric": info.metric,
        f"hpolab.{info.metric}": repr(ch.val_value), **{f"hpolab.{test_name(k)}": repr(v) for k, v in test.items()},
        writer.TAG_GATE: test_name(gate_name) if gate_name else "none", TAG_GATE_SOURCE: EVALUATE if gate_name else "none",
        writer.TAG_PREVIOUS: str(previous or "none"), TAG_EXPERIMENT: info.experiment, TAG_TASK: "custom",
        "hpolab.trial_model_uri": uri,
        **({"hpolab.seed": str(ch.config["seed"])} if "seed" in ch.config else {}),
        **({"hpolab.model_config": json.dumps(ch.config["model"], sort_keys=True)} if "model" in ch.config else {}),
        **{k: v for k, v in ch.run_tags.items() if k.startswith("env.")},
    }
    if example is not None and example.dtype != object:
        tags.update({TAG_RAW_SHAPE: json.dumps(list(example.shape[1:])), TAG_RAW_DTYPE: str(example.dtype)})
    if exports is not None:
        tags.update({writer.TAG_ONNX_DIFF: repr(exports.onnx_diff), writer.TAG_TS_DIFF: repr(exports.torchscript_diff),
                     "hpolab.onnx_exporter": exports.exporter,
                     "hpolab.export_onnx": f"{writer.EXPORT_DIR}/{exports.onnx.name}",
                     "hpolab.export_torchscript": f"{writer.EXPORT_DIR}/{exports.torchscript.name}"})
    else:
        tags[TAG_EXPORT_SKIPPED] = skipped or "unknown"
        print(f"exports skipped: {tags[TAG_EXPORT_SKIPPED]}", file=sys.stderr)
    return {k: str(v)[: writer.MAX_TAG] for k, v in tags.items()}


def _register(client, model_name: str, info, ch, uri: str, tags: dict[str, str]) -> str:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(model_name, description=f"hpolab: promoted from study {info.name}" if model_name == info.name else None)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    model_id = uri.removeprefix("models:/") if uri.startswith("models:/m-") else None
    gate_text = f"{tags['hpolab.gate_metric']} {tags.get('hpolab.' + tags['hpolab.gate_metric'], '-')}"
    mv = client.create_model_version(model_name, source=uri, run_id=ch.run_id, tags=tags, model_id=model_id,
                                     description=f"study {info.name}, trial {ch.trial_number} (own loop): gate {gate_text}")
    return str(mv.version)
