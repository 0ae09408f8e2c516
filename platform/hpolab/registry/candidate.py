"""The challenger as promote judges it: its model, its test metrics, the alias holder scored the same
way, its exports and what is registered. promote.py runs the same steps for every experiment; what
differs is decided here by what the experiment provides, not by how its trials were trained:

- `evaluate(model, split)` defined, or no task to score with (`Logged`): the trial's logged MLflow
  model (what trial.log_model kept, or what log_models kept) is loaded as it is and scored by
  evaluate(model, "test"); the alias holder too, when the same experiment's evaluate() scored it (tag
  hpolab.gate_source = evaluate), else it is not comparable. Only the experiment knows that split and
  those metrics. Exports come from the model's logged input example; one that fails is skipped with
  its reason (hpolab.export_skipped): the model's own flavour is what is registered. The version's
  source is the logged model itself, task "custom" (predict prints its raw outputs as output_<j>),
  since no task says what they mean. No evaluate(): exit 2 saying to define it; --force registers
  the logged model ungated (hpolab.gate_metric = none), as mlflow.register_model would.
- data, a model and a task (load_data, build_model; `Served`): the model is rebuilt from the trial's
  checkpoints/best.pt (where retention removed it, the model the trial logged from it, when it logged
  one) and wrapped with the experiment's preprocessing (serving.ServingModel), and the
  task scores it on the raw test split (evaluation.py), the holder on the same split (champion.py).
  Raw inputs and a task are known, so the exports must pass parity on the test inputs (else exit 1)
  and a serving model with the tags predict needs is logged and registered (writer.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpolab.errors import UserError
from hpolab.registry import gate
from hpolab.registry.evaluation import PromotionFailed
from hpolab.registry.selection import load_logged, trial_model_uri

TAG_GATE_SOURCE = "hpolab.gate_source"  # on a version: "evaluate" or "none" -- what its test metrics mean
EVALUATE = "evaluate"


def load(client, stores, info, ch, exp, tmp: Path, force: bool):
    """The challenger scored as its experiment allows (module docstring); fills ch.config and ch.run_tags."""
    return Logged(client, info, ch, exp, tmp, force) if registers_logged_model(exp) else Served(client, stores, info, ch, exp, tmp)


def registers_logged_model(exp) -> bool:
    """Promote registers the trial's logged model (which the trials must then keep): the experiment
    scores models itself (evaluate), or it has no data and model the platform could rebuild and score."""
    rebuildable = callable(getattr(exp, "build_model", None)) and callable(getattr(exp, "load_data", None))
    return callable(getattr(exp, EVALUATE, None)) or not rebuildable


class Served:
    """Rebuilt from best.pt (else logged), served with the experiment's preprocessing, scored by its task on the raw test split."""

    loader, note, label = "mlflow.pyfunc", "", ""  # how the registered version loads; what the lines saying so add

    def __init__(self, client, stores, info, ch, exp, tmp: Path):
        from hpolab.registry import evaluation, selection
        from hpolab.train.config import trainer_config

        exp, splits, model, serving, bound = selection.load_challenger(client, stores, info, ch, tmp, exp)
        self.ev = evaluation.evaluate_challenger(exp, ch.config, splits, model, serving, bound)
        self.metrics = self.ev.metrics
        # by val_ name, as an evaluate()'s METRIC_DIRECTIONS (classification's test evaluation always has
        # macro_f1, its epochs only when imbalance is on)
        self.declared = {**bound.task.metric_directions(trainer_config(ch.config["trainer"])),
                         **({"val_macro_f1": "maximize"} if bound.task.name == "classification" else {})}
        self.registers = f"a new version of {{model}} from trial {ch.trial_number} (run {ch.run_id}), with its exports,"

    def prefix(self, gate_name: str) -> str:
        return "test_"

    def holder_metrics(self, holder, model_name: str, info, ch, gate_name: str):
        from hpolab.registry.champion import evaluate_holder

        ev = self.ev
        return evaluate_holder(holder, model_name, info.experiment, ch.config, ev.x_raw, ev.y, ev.bound, ev.fingerprint)

    def print_table(self, info, ch, alias: str, holder, held: dict | None) -> None:
        test = self.metrics
        names = [k for k in test if k not in ("n", "recall") and isinstance(test[k], (int, float))]
        names = sorted(names, key=lambda k: (k != "acc", k != "loss", k))  # classification keeps its columns: acc, loss, macro_f1
        print(f"held-out test split: {len(self.ev.x_raw)} samples (no trial trained or selected on them)")
        _rows(info, ch, alias, holder, held, test, names, [f"{'test_' + k:>{max(10, len(k) + 5)}s}" for k in names])

    def export(self, tmp: Path):
        from hpolab.registry.evaluation import export_and_check

        return export_and_check(self.ev, tmp), None

    def write(self, client, model_name: str, alias: str, info, ch, gate_name: str, selection_metric: str, exports, skipped,
              previous) -> str:
        from hpolab.registry.writer import write_version

        return write_version(client, model_name, alias, info, ch, self.metrics, gate_name, selection_metric, (exports, skipped),
                             previous, ev=self.ev)


class Logged:
    """The trial's logged model as it loads, scored by the experiment's evaluate(model, "test") (none: --force)."""

    loader, note = "mlflow.pytorch", "  (inputs as the model takes them)"

    def __init__(self, client, info, ch, exp, tmp: Path, force: bool):
        self.evaluate = getattr(exp, EVALUATE, None) if callable(getattr(exp, EVALUATE, None)) else None
        if self.evaluate is None and not force:
            raise UserError(f"experiment {info.experiment} has no evaluate(model, split): define it (returning e.g. "
                            f"{{{gate.candidates(info.metric)[0]!r}: ...}} for split \"test\") so promote can gate on "
                            "held-out data, or pass --force to register the trial's logged model ungated")
        ch.run_tags = dict(client.get_run(ch.run_id).data.tags)
        ch.config = _trial_config(ch, tmp)
        self.uri = trial_model_uri(client, ch)
        self.model = load_logged(self.uri, f"trial {ch.trial_number}'s logged model {self.uri}")
        self.metrics = _evaluate(self.evaluate, self.model, info) if self.evaluate is not None else None
        self.declared = getattr(exp, "METRIC_DIRECTIONS", None) or {}
        self.registers = f"the logged model of trial {ch.trial_number} (run {ch.run_id}) as a new version of {{model}}"
        self.label = f" (trial {ch.trial_number}'s logged model)"
        self.example = None

    def prefix(self, gate_name: str) -> str:  # names as evaluate() returned them
        return "" if gate_name.startswith("test_") else "test "

    def holder_metrics(self, holder, model_name: str, info, ch, gate_name: str):
        """(the holder's metrics, None) or (None, why it cannot be compared)."""
        from hpolab.registry.serving import TAG_EXPERIMENT

        tags = holder.tags
        if tags.get(TAG_GATE_SOURCE) != EVALUATE or tags.get(TAG_EXPERIMENT) != info.experiment:
            return None, (f"it was not scored by experiment {info.experiment}'s evaluate() (experiment "
                          f"{tags.get(TAG_EXPERIMENT, 'unknown')}, gate {tags.get(TAG_GATE_SOURCE, 'the routine test split')})")
        try:
            held = _evaluate(self.evaluate, load_logged(f"models:/{model_name}/{holder.version}", f"version {holder.version}"), info)
        except (UserError, PromotionFailed) as e:
            return None, str(e)
        return (held, None) if gate_name in held else (None, f"its evaluate() result lacks {gate_name}")

    def print_table(self, info, ch, alias: str, holder, held: dict | None) -> None:
        names = list(self.metrics)
        print(f"held-out test split: the experiment's evaluate(model, \"test\") (gate: {gate.gate_metric(info.metric, names)})")
        # "test " before each name when one is the study metric's (the first column)
        _rows(info, ch, alias, holder, held, self.metrics, names, [f"{'test ' + k if info.metric in names else k:>12s}" for k in names])

    def export(self, tmp: Path):
        from hpolab.registry.evaluation import export_or_skip

        self.example = _input_example(self.uri, tmp)
        return export_or_skip(self.model, self.example, tmp)

    def write(self, client, model_name: str, alias: str, info, ch, gate_name: str | None, selection_metric: str, exports,
              skipped, previous) -> str:
        import json

        from hpolab.registry.serving import TAG_EXPERIMENT, TAG_RAW_DTYPE, TAG_RAW_SHAPE, TAG_TASK
        from hpolab.registry.writer import write_version

        tags = {TAG_GATE_SOURCE: EVALUATE if gate_name else "none", TAG_EXPERIMENT: info.experiment, TAG_TASK: "custom"}
        if self.example is not None and self.example.dtype != object:  # what predict reads its inputs as
            tags.update({TAG_RAW_SHAPE: json.dumps(list(self.example.shape[1:])), TAG_RAW_DTYPE: str(self.example.dtype)})
        return write_version(client, model_name, alias, info, ch, self.metrics or {}, gate_name, selection_metric,
                             (exports, skipped), previous, logged=(self.uri, tags))


def _rows(info, ch, alias: str, holder, held, test: dict, names: list[str], headers: list[str]) -> None:
    """The table's header and its rows: the challenger, and the holder when there is one."""
    print(f"  {'':28s} {info.metric:>10s} " + " ".join(headers))
    rows = [(f"challenger: trial {ch.trial_number}", ch.val_value, test)]
    if holder is not None:
        val = holder.tags.get(f"hpolab.{info.metric}")
        rows.append((f"{alias}: version {holder.version}", float(val) if val not in (None, "", "None") else None, held))
    for label, val, m in rows:
        cells = " ".join(f"{(f'{m[k]:.4f}' if m and k in m else '-'):>{len(h)}s}" for k, h in zip(names, headers))
        print(f"  {label:28s} {('-' if val is None else f'{val:.4f}'):>10s} {cells}")


def _trial_config(ch, tmp: Path) -> dict:
    """The trial's resolved config (config.yaml of its run): lineage tags only; {} when it is missing."""
    import mlflow.artifacts
    import yaml

    try:
        path = mlflow.artifacts.download_artifacts(run_id=ch.run_id, artifact_path="config.yaml", dst_path=str(tmp / "config"))
        return yaml.safe_load(Path(path).read_text()) or {}
    except Exception:  # noqa: BLE001 -- lineage only
        return {}


def _evaluate(evaluate, model, info) -> dict[str, float]:
    import torch

    try:
        with torch.inference_mode():
            returned = evaluate(model, "test")
    except Exception as e:  # noqa: BLE001 -- the experiment's code: its error, one line
        raise PromotionFailed(f"experiment {info.experiment}: evaluate(model, \"test\") raised {type(e).__name__}: {e}") from e
    return gate.checked_metrics(returned, info.experiment, info.metric)


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
