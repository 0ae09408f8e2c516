"""`hpolab promote NAME`: the best COMPLETE trial -> held-out test gate -> registry version + alias + exports.

Steps (everything that can refuse or fail runs before anything is written):

1. Pick the best COMPLETE trial by the study metric and direction (or `--metric`, read at each trial's
   best-checkpoint epoch). Pruned and failed trials are never candidates.
2. Rebuild its model from `checkpoints/best.pt` and wrap it with the experiment's preprocessing
   (`serving.ServingModel`: raw inputs in, logits out). Evaluate on the experiment's raw **test**
   split, which no trial saw (trials select on val).
3. Evaluate the current holder of the alias on the same test split (same fingerprint of inputs and
   labels, else the two are not comparable). The challenger must be strictly better on the gate
   metric (test_acc for val_acc, test_loss for val_loss, ...; an exact tie is decided by test_loss,
   or test_acc for a loss gate) unless `--force`; otherwise exit 3 and nothing is written.
4. Export ONNX (dynamic batch axis) and TorchScript to a temporary folder; ONNX Runtime on the
   test inputs must agree with PyTorch within 1e-4 (max abs logit difference), else exit 1.
   `--dry-run` stops here: it prints what would happen, writes nothing, and exits with the code the
   real run would (0, or 3 when refused).
5. Write: a run `promote-trial-<n>` nested under the study's parent run holds the serving model
   (an MLflow LoggedModel, torch.export "pt2" format, raw-input signature), export/model.onnx,
   export/model.torchscript.pt and the test metrics. A new version of the registered model is created
   from that serving model, tagged with its lineage, and the alias moves to it.

Idempotent: a version whose tag hpolab.trial_run_id names the same trial run is reused (the alias
moves to it if it wins), never duplicated; if it already holds the alias there is nothing to do.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpolab.stores.paths import Stores

from hpolab.errors import EXIT_FAILED, EXIT_OK, EXIT_REFUSED  # refused: the challenger is not better; nothing changed

SERVING_MODEL_NAME = "serving_model"  # the LoggedModel's name in the promote run
EXPORT_DIR = "export"  # artifact folder of the promote run: model.onnx, model.torchscript.pt
EXAMPLE_ROWS = 4  # raw test rows saved as the model's input example (> 1 keeps the batch axis dynamic)
PREPROCESS_CHECK_ROWS = 256  # test rows on which raw_test + preprocess must reproduce the test split
PREPROCESS_TOLERANCE = 1e-4  # max abs logit difference between those two paths

# val_* metric a study selects on -> the test metric that gates promotion, and its direction
TEST_METRIC_FOR = {"val_acc": "acc", "val_loss": "loss", "val_macro_f1": "macro_f1"}
TEST_DIRECTION = {"acc": "maximize", "loss": "minimize", "macro_f1": "maximize"}
# An exact tie on the gate metric (likely with accuracy on a small test set, e.g. two models at
# 100 %) is decided by a second test metric, so a perfect champion does not freeze the alias forever.
TIE_BREAK = {"acc": "loss", "macro_f1": "loss", "loss": "acc"}
ALIAS_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")

# Version tags (lineage); plus serving.TAG_* (what predict needs) and the trial run's env.* tags.
TAG_STUDY = "hpolab.study"
TAG_TRIAL = "hpolab.trial_number"
TAG_TRIAL_RUN = "hpolab.trial_run_id"
TAG_PREVIOUS = "hpolab.previous_champion"
TAG_ONNX_DIFF = "hpolab.onnx_max_abs_diff"
TAG_TS_DIFF = "hpolab.torchscript_max_abs_diff"
TAG_GATE = "hpolab.gate_metric"
MAX_TAG = 5000


class PromotionFailed(RuntimeError):
    """The promotion could not be completed; the message says why (exit 1)."""


@dataclass
class Challenger:
    trial_number: int
    run_id: str
    selection_value: float
    val_value: float | None  # the study metric on val at the best checkpoint
    config: dict[str, Any] = field(default_factory=dict)
    run_tags: dict[str, str] = field(default_factory=dict)


@dataclass
class StudyInfo:
    name: str
    experiment: str
    metric: str
    direction: str
    parent_run_id: str
    experiment_id: str


def promote_cmd(args, stores: Stores) -> int:
    from hpolab.errors import UserError

    if not ALIAS_RE.match(args.alias) or args.alias == "latest" or re.fullmatch(r"v\d+", args.alias):
        raise UserError(f"--alias {args.alias!r}: use letters, digits, '_' or '-' (not 'latest' or v<number>, which MLflow reserves)")
    try:
        return Promotion(args, stores).run()
    except PromotionFailed as e:
        print(f"hpolab promote: FAILED: {e}")
        return EXIT_FAILED


class Promotion:
    def __init__(self, args, stores: Stores):
        from hpolab.stores.mlflow_runs import client_for

        self.args = args
        self.stores = stores
        self.client = client_for(stores)
        self.model_name = args.model_name or args.name
        self.alias = args.alias
        self.dry = bool(args.dry_run)

    # ------------------------------------------------------------------ 1. the challenger

    def _study(self):
        from hpolab.errors import UserError
        from hpolab.stores.optuna_storage import load_study

        study = load_study(self.args.name, self.stores)  # UserError when unknown
        parent_id = study.user_attrs.get("mlflow_parent_run_id")
        try:
            parent = self.client.get_run(parent_id) if parent_id else None
        except Exception:
            parent = None
        if parent is None:
            raise UserError(f"study {self.args.name!r} has no MLflow parent run in {self.stores.tracking_uri}; is --tracking-uri the one the study used?")
        p = parent.data.params
        info = StudyInfo(
            name=self.args.name,
            experiment=p.get("experiment", ""),
            metric=p.get("metric", "val_acc"),
            direction=study.direction.name.lower(),
            parent_run_id=parent_id,
            experiment_id=parent.info.experiment_id,
        )
        if not info.experiment:
            raise UserError(f"the parent run of study {info.name!r} does not record its experiment (param 'experiment')")
        return study, info

    def _selection(self, info: StudyInfo) -> tuple[str, str]:
        from hpolab.errors import UserError

        metric = self.args.metric or info.metric
        if metric == info.metric:
            return metric, info.direction
        name = metric.lower()
        if any(k in name for k in ("loss", "err")):
            return metric, "minimize"
        if any(k in name for k in ("acc", "f1", "recall", "precision", "auc")):
            return metric, "maximize"
        raise UserError(f"--metric {metric}: cannot tell whether it should be maximized or minimized; use a *_loss, *_acc or *_f1 metric")

    def _pick(self, study, info: StudyInfo, metric: str, direction: str) -> Challenger:
        from optuna.trial import TrialState

        from hpolab.errors import UserError

        trials = study.get_trials(deepcopy=False)
        states = {s: sum(t.state == s for t in trials) for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
        complete = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("mlflow_run_id")]
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
                value, names = self._metric_at_best_epoch(run_id, metric)
                logged |= names
            if value is None or value != value:  # missing or NaN
                continue
            candidates.append(Challenger(t.number, run_id, float(value), t.value))
        if not candidates:
            known = ", ".join(sorted(logged)) or "none"
            raise UserError(f"--metric {metric}: no COMPLETE trial of {info.name!r} logged it (logged metrics: {known})")
        best = (max if direction == "maximize" else min)(candidates, key=lambda c: c.selection_value)
        how = "" if metric == info.metric else " at each trial's best-checkpoint epoch"
        print(f"best by {metric} ({direction}{how}): trial {best.trial_number} (run {best.run_id}), {metric} = {best.selection_value:.4f}")
        return best

    def _metric_at_best_epoch(self, run_id: str, metric: str) -> tuple[float | None, set[str]]:
        run = self.client.get_run(run_id)
        names = set(run.data.metrics)
        if metric not in names:
            return None, names
        history = self.client.get_metric_history(run_id, metric)
        best_epoch = run.data.tags.get("hpolab.best_epoch")
        at = [m.value for m in history if best_epoch is not None and str(m.step) == best_epoch]
        return (at[-1] if at else run.data.metrics[metric]), names

    # ------------------------------------------------------------------ 2. model + test split

    def _load_challenger(self, info: StudyInfo, ch: Challenger, tmp: Path):
        import mlflow.artifacts
        import yaml

        from hpolab.errors import UserError
        from hpolab.config.experiment import load_experiment
        from hpolab.registry.serving import ServingModel
        from hpolab.train import load_checkpoint, load_model_state

        run = self.client.get_run(ch.run_id)
        ch.run_tags = dict(run.data.tags)

        def fetch(path: str) -> Path:
            try:
                return Path(mlflow.artifacts.download_artifacts(run_id=ch.run_id, artifact_path=path, dst_path=str(tmp), tracking_uri=self.stores.tracking_uri))
            except Exception as e:
                raise UserError(f"trial {ch.trial_number} (run {ch.run_id}) has no artifact {path}: {e}") from e

        ch.config = yaml.safe_load(fetch("config.yaml").read_text())
        ckpt = load_checkpoint(fetch("checkpoints/best.pt"), map_location="cpu")
        exp = load_experiment(info.experiment)
        splits = exp.load_data(ch.config["data"], ch.config["seed"])
        model = exp.build_model(ch.config["model"], tuple(splits.input_shape), splits.num_classes)
        load_model_state(model, ckpt["model"])
        model.eval()
        return exp, splits, model, ServingModel(splits.preprocess, model).eval()

    def _check_raw_test(self, splits, model, serving, x_raw: np.ndarray, y: np.ndarray) -> None:
        """raw_test + preprocess must reproduce the test split the experiment feeds the model."""
        import torch

        from hpolab.train.data import labels_of

        if len(x_raw) != len(splits.test) or not np.array_equal(labels_of(splits.test).numpy(), y):
            raise PromotionFailed("the experiment's raw_test() does not match its load_data().test (sizes or labels differ); fix the experiment")
        n = min(PREPROCESS_CHECK_ROWS, len(x_raw))
        inputs = torch.stack([torch.as_tensor(splits.test[i][0]) for i in range(n)]).float()
        with torch.inference_mode():
            a = model(inputs).float()
            b = serving(torch.from_numpy(x_raw[:n])).float()
        diff = float((a - b).abs().max())
        if diff > PREPROCESS_TOLERANCE:
            raise PromotionFailed(
                f"preprocess(raw_test) differs from the test split the model sees in training (max abs logit diff {diff:.3g} "
                f"> {PREPROCESS_TOLERANCE:g}); the experiment's preprocess must equal its eval transform"
            )

    # ------------------------------------------------------------------ 3. the alias holder

    def _holder(self):
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_model_version_by_alias(self.model_name, self.alias)
        except MlflowException as e:
            if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return None
            raise

    def _existing_version(self, run_id: str):
        from mlflow.exceptions import MlflowException

        try:
            versions = self.client.search_model_versions(f"name = '{self.model_name}'")
        except MlflowException:
            return None
        mine = [v for v in versions if v.tags.get(TAG_TRIAL_RUN) == run_id]
        return min(mine, key=lambda v: int(v.version)) if mine else None

    def _evaluate_holder(self, holder, info: StudyInfo, config: dict, x_raw, y, num_classes: int, fp: str):
        """(metrics, None) or (None, why they are not comparable)."""
        import mlflow.pytorch

        from hpolab.registry.serving import TAG_EXPERIMENT, TAG_TEST_FINGERPRINT, classification_metrics, predict_logits

        tags = holder.tags
        if tags.get(TAG_TEST_FINGERPRINT) != fp:
            if TAG_TEST_FINGERPRINT not in tags:
                why = "it carries no hpolab test fingerprint (it was not registered by hpolab promote)"
            elif tags.get(TAG_EXPERIMENT) != info.experiment:
                why = f"it comes from experiment {tags.get(TAG_EXPERIMENT)}, the challenger from {info.experiment}: no common test split"
            else:
                why = (f"its test split differs (seed {tags.get('hpolab.seed')}, data {tags.get('hpolab.data')}; the challenger's: "
                       f"seed {config['seed']}, data {json.dumps(config['data'], sort_keys=True)}): its score there could include its own training data")
            return None, why
        try:
            model = mlflow.pytorch.load_model(f"models:/{self.model_name}/{holder.version}", map_location="cpu")
            return classification_metrics(predict_logits(model, x_raw), y, num_classes), None
        except Exception as e:  # noqa: BLE001 -- reported; --force may still move the alias
            return None, f"loading/evaluating it failed: {type(e).__name__}: {e}"

    # ------------------------------------------------------------------ the command

    def run(self) -> int:
        import mlflow

        from hpolab.registry.serving import classification_metrics, fingerprint, predict_logits, raw_test_split

        mlflow.set_tracking_uri(self.stores.tracking_uri)  # the fluent model APIs resolve their client from it
        study, info = self._study()
        metric, direction = self._selection(info)
        ch = self._pick(study, info, metric, direction)

        holder = self._holder()
        existing = self._existing_version(ch.run_id)
        if existing is not None and holder is not None and existing.version == holder.version:
            print(f"{self.model_name}@{self.alias} is already version {holder.version} (trial {ch.trial_number} of {info.name}): nothing to do")
            return EXIT_OK

        with tempfile.TemporaryDirectory(prefix="hpolab-promote-") as tmp_name:
            tmp = Path(tmp_name)
            exp, splits, model, serving = self._load_challenger(info, ch, tmp)
            x_raw, y = raw_test_split(exp, ch.config)
            self._check_raw_test(splits, model, serving, x_raw, y)
            fp = fingerprint(x_raw, y)
            logits = predict_logits(serving, x_raw)
            test = classification_metrics(logits, y, splits.num_classes)

            gate = TEST_METRIC_FOR.get(metric) or TEST_METRIC_FOR.get(info.metric) or "acc"
            gate_dir = TEST_DIRECTION[gate]
            held = None
            why_not = None
            if holder is not None:
                held, why_not = self._evaluate_holder(holder, info, ch.config, x_raw, y, splits.num_classes, fp)
            self._print_table(info, ch, test, holder, held, len(x_raw))

            # ---- the gate
            if holder is None:
                verdict = f"{self.model_name}@{self.alias} does not exist yet: the challenger takes it"
            elif held is None:
                verdict = f"the current {self.alias} (version {holder.version}) cannot be compared: {why_not}"
                if not self.args.force:
                    print(f"REFUSED: {verdict}. Nothing changed; --force moves the alias anyway.")
                    return EXIT_REFUSED
                verdict += "; --force: moving the alias anyway"
            else:
                better = _better(test, held, gate)
                cmp = f"test_{gate} {test[gate]:.4f} vs {held[gate]:.4f} ({gate_dir})"
                if test[gate] == held[gate]:
                    tie = TIE_BREAK[gate]
                    cmp += f", tied: test_{tie} {test[tie]:.4f} vs {held[tie]:.4f} ({TEST_DIRECTION[tie]})"
                if better:
                    verdict = f"the challenger beats {self.alias} version {holder.version}: {cmp}"
                elif not self.args.force:
                    print(f"REFUSED: the challenger (trial {ch.trial_number} of {info.name}) is not better than "
                          f"{self.model_name}@{self.alias} (version {holder.version}): {cmp}. Nothing changed; --force moves the alias anyway.")
                    return EXIT_REFUSED
                else:
                    verdict = f"the challenger is NOT better than version {holder.version} ({cmp}); --force: moving the alias anyway"
            print(verdict)

            previous = holder.version if holder is not None else None
            if existing is not None:  # idempotent: this trial already has a version (with its exports)
                if self.dry:
                    print(f"dry run: would move @{self.alias} to the existing version {existing.version} of {self.model_name} "
                          f"(trial {ch.trial_number}, run {ch.run_id}) from {previous or 'nobody'}; nothing was written")
                    return EXIT_OK
                self.client.set_model_version_tag(self.model_name, existing.version, TAG_PREVIOUS, str(previous or "none"))
                self.client.set_registered_model_alias(self.model_name, self.alias, existing.version)
                print(f"{self.model_name} version {existing.version} already holds trial {ch.trial_number} (run {ch.run_id}): "
                      f"no new version; @{self.alias} -> version {existing.version}" + (f" (was version {previous})" if previous else ""))
                return EXIT_OK

            # ---- exports + parity, still nothing written
            from hpolab.registry.export import ONNX_TOLERANCE, ExportError, export_onnx, export_torchscript, onnx_max_abs_diff, torchscript_max_abs_diff

            import torch

            example = torch.from_numpy(x_raw[:EXAMPLE_ROWS])
            reference = logits.numpy()
            try:
                onnx_path, exporter = export_onnx(serving, example, tmp / "model.onnx")
                onnx_diff = onnx_max_abs_diff(onnx_path, x_raw, reference)
                ts_path = export_torchscript(serving, example, tmp / "model.torchscript.pt")
                ts_diff = torchscript_max_abs_diff(ts_path, x_raw, reference)
            except ExportError as e:
                raise PromotionFailed(f"{e}; nothing was registered") from e
            print(f"exports: ONNX ({exporter} exporter) max abs diff vs PyTorch {onnx_diff:.3g} on {len(x_raw)} test inputs "
                  f"(limit {ONNX_TOLERANCE:g}); TorchScript {ts_diff:.3g}")
            if not onnx_diff <= ONNX_TOLERANCE:
                raise PromotionFailed(
                    f"ONNX parity: ONNX Runtime's logits differ from PyTorch's by up to {onnx_diff:.3g} on the test inputs "
                    f"(limit {ONNX_TOLERANCE:g}); nothing was registered"
                )

            if self.dry:
                print(f"dry run: would register a new version of {self.model_name} from trial {ch.trial_number} "
                      f"(run {ch.run_id}), with its exports, and move @{self.alias} to it (from {previous or 'nobody'}); nothing was written")
                return EXIT_OK

            version = self._write(info, ch, exp, splits, serving, x_raw, y, logits, test, gate, previous,
                                  {"onnx": onnx_path, "torchscript": ts_path}, onnx_diff, ts_diff, exporter)
        print(f"registered {self.model_name} version {version}; @{self.alias} -> version {version}"
              + (f" (was version {previous})" if previous else ""))
        print(f'load it: mlflow.pyfunc.load_model("models:/{self.model_name}@{self.alias}")  '
              f"or  hpolab predict models:/{self.model_name}@{self.alias} INPUT.npy")
        return EXIT_OK

    def _print_table(self, info: StudyInfo, ch: Challenger, test: dict, holder, held: dict | None, n: int) -> None:
        vm = info.metric
        rows = [(f"challenger: trial {ch.trial_number}", ch.val_value, test)]
        if holder is not None:
            val = holder.tags.get(f"hpolab.{vm}")
            rows.append((f"{self.alias}: version {holder.version}", float(val) if val else None, held))
        print(f"held-out test split: {n} samples (no trial trained or selected on them)")
        print(f"  {'':28s} {vm:>10s} {'test_acc':>10s} {'test_loss':>10s} {'test_macro_f1':>14s}")
        for label, val, m in rows:
            f = (lambda k: f"{m[k]:.4f}") if m else (lambda k: "-")
            v = f"{val:.4f}" if val is not None else "-"
            print(f"  {label:28s} {v:>10s} {f('acc'):>10s} {f('loss'):>10s} {f('macro_f1'):>14s}")

    # ------------------------------------------------------------------ 5. writes

    def _write(self, info, ch, exp, splits, serving, x_raw, y, logits, test, gate, previous, files, onnx_diff, ts_diff, exporter) -> str:
        import mlflow.pytorch
        import torch
        from mlflow.exceptions import MlflowException
        from mlflow.models import infer_signature
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

        from hpolab.registry.serving import predict_logits, serving_tags
        from hpolab.stores import mlflow_runs as tr
        from hpolab.stores.environment import capture_environment
        from hpolab.stores.models import new_run_model

        env = capture_environment(Path.cwd())
        run_name = f"promote-trial-{ch.trial_number}"
        run = self.client.create_run(
            info.experiment_id,
            run_name=run_name,
            tags={
                MLFLOW_PARENT_RUN_ID: info.parent_run_id,
                MLFLOW_RUN_NAME: run_name,
                "hpolab.role": "promote",
                "optuna.study": info.name,
                "optuna.trial_number": str(ch.trial_number),
                TAG_TRIAL_RUN: ch.run_id,
                "hpolab.registered_model": self.model_name,
                **env,
            },
        )
        run_id = run.info.run_id
        try:
            s_tags = serving_tags(info.experiment, x_raw, y, splits.num_classes, tuple(splits.class_names))
            example = x_raw[:EXAMPLE_ROWS]
            logged = mlflow.pytorch.log_model(
                serving,
                name=SERVING_MODEL_NAME,
                model_id=new_run_model(self.client, run_id, SERVING_MODEL_NAME, s_tags).model_id,  # in the study's experiment
                input_example=example,
                signature=infer_signature(example, logits[:EXAMPLE_ROWS].numpy()),
                run_id=run_id,
                pip_requirements=_pip_requirements(ch.run_tags),
                tags=s_tags,
            )
            # The registered artifact (torch.export "pt2") must predict exactly what we evaluated.
            served = predict_logits(mlflow.pytorch.load_model(logged.model_uri, map_location="cpu"), x_raw)
            if not torch.equal(served.argmax(1), logits.argmax(1)):
                raise PromotionFailed("the logged serving model's predictions differ from the evaluated model's; nothing was registered")
            served_diff = float((served - logits).abs().max())
            for f in files.values():
                self.client.log_artifact(run_id, str(f), EXPORT_DIR)
            metrics = {f"test_{k}": v for k, v in test.items() if k != "n"}
            metrics.update({"onnx_max_abs_diff": onnx_diff, "torchscript_max_abs_diff": ts_diff, "serving_max_abs_diff": served_diff})
            if ch.val_value is not None:
                metrics[info.metric] = ch.val_value
            tr.log_epoch(self.client, run_id, 0, metrics)

            lineage = {
                TAG_STUDY: info.name,
                TAG_TRIAL: str(ch.trial_number),
                TAG_TRIAL_RUN: ch.run_id,
                "hpolab.promote_run_id": run_id,
                "hpolab.selection_metric": self.args.metric or info.metric,
                f"hpolab.{info.metric}": repr(ch.val_value),
                **{f"hpolab.test_{k}": repr(v) for k, v in test.items()},
                TAG_GATE: f"test_{gate}",
                TAG_PREVIOUS: str(previous or "none"),
                TAG_ONNX_DIFF: repr(onnx_diff),
                "hpolab.onnx_exporter": exporter,
                TAG_TS_DIFF: repr(ts_diff),
                "hpolab.seed": str(ch.config["seed"]),
                "hpolab.data": json.dumps(ch.config["data"], sort_keys=True),
                "hpolab.model_config": json.dumps(ch.config["model"], sort_keys=True),
                "hpolab.trial_model_uri": ch.run_tags.get("hpolab.model_uri", ""),
                "hpolab.export_onnx": f"{EXPORT_DIR}/{files['onnx'].name}",
                "hpolab.export_torchscript": f"{EXPORT_DIR}/{files['torchscript'].name}",
                **s_tags,
                **{k: v for k, v in ch.run_tags.items() if k.startswith("env.")},  # what trained it
            }
            lineage = {k: str(v)[:MAX_TAG] for k, v in lineage.items()}
            try:
                self.client.create_registered_model(self.model_name, description=f"hpolab: promoted from study {info.name}" if self.model_name == info.name else None)
            except MlflowException as e:
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            mv = self.client.create_model_version(
                self.model_name,
                source=logged.model_uri,
                run_id=run_id,
                tags=lineage,
                model_id=logged.model_id,
                description=f"study {info.name}, trial {ch.trial_number}: {info.metric} {ch.val_value:.4f}, test_acc {test['acc']:.4f}",
            )
            self.client.set_registered_model_alias(self.model_name, self.alias, mv.version)
            tr.set_tags(self.client, run_id, {"hpolab.registered_version": str(mv.version), "hpolab.serving_model_uri": logged.model_uri})
            self.client.set_terminated(run_id, status="FINISHED")
            return str(mv.version)
        except BaseException as e:
            try:
                tr.set_tags(self.client, run_id, {"hpolab.fail_reason": f"{type(e).__name__}: {e}"})
                self.client.set_terminated(run_id, status="FAILED")
            except Exception:
                pass
            raise


def _better(challenger: dict[str, float], holder: dict[str, float], gate: str) -> bool:
    """Strictly better on the gate metric; on an exact tie, strictly better on TIE_BREAK[gate]."""

    def key(m: dict[str, float], name: str) -> float:
        return m[name] if TEST_DIRECTION[name] == "maximize" else -m[name]

    tie = TIE_BREAK[gate]
    return (key(challenger, gate), key(challenger, tie)) > (key(holder, gate), key(holder, tie))


def _pip_requirements(env: dict[str, str]) -> list[str]:
    """Pinned from the training run's env tags; explicit, so MLflow skips its slow inference."""
    from importlib import metadata

    def v(tag: str, dist: str) -> str:
        value = env.get(tag) or metadata.version(dist)
        return value.split("+")[0]

    return [f"torch=={v('env.torch', 'torch')}", f"mlflow=={v('env.mlflow', 'mlflow')}", f"numpy=={v('env.numpy', 'numpy')}"]
