"""The hand-written loop hpolab is measured against: Optuna's `study.optimize` + MLflow, in ONE process.

    PYTHONPATH=platform .venv/bin/python bench/baseline_loop.py --store /tmp/b [--log-models] [key=value ...]

This is what a practitioner who already uses Optuna and MLflow would write: an in-process objective
that trains with the same routine (`hpolab.train.fit`) on the same experiment and the same resolved
configuration as `hpolab study run studies/digits_cnn.yaml key=value ...`, and logs the same content:
a parent run, one child run `trial-<n>` per trial with the resolved config as params, one log_batch
of every metric per epoch, `checkpoints/best.pt`, and (with --log-models, as hpolab does for every
COMPLETE trial) the final model with `mlflow.pytorch.log_model`. No isolation, no pruning, no retries.

Both stores are SQLite files in --store (optuna.db, mlflow.db, artifacts/), like hpolab's.
--summary FILE writes the timings as JSON (bench/overhead.py reads them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "studies" / "digits_cnn.yaml"


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """Nested config -> {"trainer.lr": "0.003", ...}: MLflow params are flat strings."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:6000]  # MLflow's param length limit
    return out


def suggest(trial, search_space: dict) -> dict:
    """The spec's search space as trial.suggest_* calls, in the spec's order.

    Same distributions in the same order as hpolab's `study.ask(fixed_distributions=...)`, so a
    seeded RandomSampler proposes the very same values on both sides."""
    params = {}
    for path, d in search_space.items():
        if d.type == "float":
            params[path] = trial.suggest_float(path, d.low, d.high, log=d.log, step=d.step)
        elif d.type == "int":
            params[path] = trial.suggest_int(path, d.low, d.high, log=d.log, step=d.step)
        else:
            params[path] = trial.suggest_categorical(path, d.choices)
    return params


def make_sampler(spec):
    import optuna

    kinds = {"random": optuna.samplers.RandomSampler, "tpe": optuna.samplers.TPESampler}
    if spec.sampler.type not in kinds:
        sys.exit(f"baseline_loop: sampler {spec.sampler.type!r} not supported here; use sampler={{type: random}} or tpe")
    if spec.pruner.type != "none":
        sys.exit("baseline_loop: the hand-written loop does not prune; pass pruner={type: none}")
    return kinds[spec.sampler.type](**{"seed": spec.seed, **spec.sampler.kwargs})


def pip_requirements() -> list[str]:
    # Explicit requirements, as hpolab gives them: otherwise MLflow infers them by loading the model
    # again, which would make the baseline slower than it needs to be (and flatter hpolab).
    from importlib import metadata

    return [f"{d}=={metadata.version(d).split('+')[0]}" for d in ("torch", "numpy", "mlflow")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="folder for optuna.db, mlflow.db, artifacts/ (created)")
    ap.add_argument("--spec", type=Path, default=SPEC)
    ap.add_argument("--log-models", action="store_true", help="log each trial's model (hpolab does, for COMPLETE trials)")
    ap.add_argument("--summary", type=Path, help="write timings here (JSON)")
    ap.add_argument("overrides", nargs="*", help="key=value, as for `hpolab study run`")
    args = ap.parse_args()
    t_process = time.time()  # wall clock, s (imports below are part of what the practitioner pays)

    import logging

    import mlflow
    import mlflow.pytorch
    import optuna
    import torch
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param
    from mlflow.models import infer_signature

    from hpolab.config.experiment import load_experiment
    from hpolab.config.spec import load_spec
    from hpolab.train import fit, load_checkpoint, load_model_state, seed_everything
    from hpolab.train.config import trainer_config

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    spec = load_spec(args.spec, args.overrides)
    exp = load_experiment(spec.experiment, search_from=args.spec.parent)
    store = args.store.resolve()
    store.mkdir(parents=True, exist_ok=True)

    # ---- stores: SQLite for both, artifacts inside the store (as hpolab's embedded default)
    tracking_uri = f"sqlite:///{store / 'mlflow.db'}"
    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri)
    experiment_id = client.create_experiment(spec.name, artifact_location=(store / "artifacts").as_uri())
    mlflow.set_experiment(experiment_id=experiment_id)  # log_model files the model under the active experiment
    study = optuna.create_study(
        storage=f"sqlite:///{store / 'optuna.db'}", study_name=spec.name,
        direction=spec.direction, sampler=make_sampler(spec),
    )
    parent = client.create_run(experiment_id, run_name=spec.name, tags={"optuna.study": spec.name})
    parent_id = parent.info.run_id
    fit_seconds: list[float] = []  # per trial: fit() alone, s
    epochs: list[int] = []

    def objective(trial: optuna.Trial) -> float:
        config = spec.resolved_config(exp, suggest(trial, spec.search_space))
        run = client.create_run(
            experiment_id, run_name=f"trial-{trial.number}",
            tags={"mlflow.parentRunId": parent_id, "optuna.study": spec.name, "optuna.trial_number": str(trial.number)},
        )
        run_id = run.info.run_id
        trial.set_user_attr("mlflow_run_id", run_id)
        client.log_batch(run_id, params=[Param(k, v) for k, v in flatten(config).items()])

        # Same order as hpolab's trial process: seed, then data, then model (initial weights).
        seed_everything(config["seed"], bool(config["trainer"]["deterministic"]))
        data = exp.load_data(config["data"], config["seed"])
        model = exp.build_model(config["model"], data.input_shape, data.num_classes)
        ckpt_dir = store / "trials" / spec.name / f"trial-{trial.number}"

        def on_epoch(epoch: int, metrics: dict[str, float]) -> bool:
            ts = int(time.time() * 1000)  # ms, as MLflow wants
            client.log_batch(run_id, metrics=[Metric(k, float(v), ts, epoch) for k, v in metrics.items()])
            trial.report(metrics[spec.metric], epoch)  # for the record only: no pruner here
            return False

        t0 = time.perf_counter()
        result = fit(trainer_config(config["trainer"]), model, data, metric=spec.metric, direction=spec.direction,
                     seed=config["seed"], on_epoch=on_epoch, checkpoint_dir=ckpt_dir)
        fit_seconds.append(time.perf_counter() - t0)
        epochs.append(result.epochs_run)

        if result.best_checkpoint:
            client.log_artifact(run_id, str(result.best_checkpoint), "checkpoints")
        if args.log_models:
            # The best epoch's weights, with a real input example (MLflow 3's pt2 format needs one).
            model = model.to("cpu").eval()
            load_model_state(model, load_checkpoint(result.best_checkpoint or result.last_checkpoint)["model"])
            example = torch.stack([data.val[i][0] for i in range(2)]).float()
            with torch.inference_mode():
                out = model(example)
            with mlflow.start_run(run_id=run_id):
                mlflow.pytorch.log_model(model, name="model", input_example=example.numpy(),
                                         signature=infer_signature(example.numpy(), out.numpy()),
                                         pip_requirements=pip_requirements())
        client.set_terminated(run_id, "FINISHED")
        return result.best_value

    t_study = time.time()
    study.optimize(objective, n_trials=spec.n_trials)
    t_study_end = time.time()
    client.set_terminated(parent_id, "FINISHED")

    summary = {
        "process_start": t_process,  # wall clock, s since the epoch
        "study_start": t_study,
        "study_end": t_study_end,
        "study_seconds": t_study_end - t_study,
        "trials": len(study.trials),
        "fit_seconds": fit_seconds,
        "epochs": epochs,
        "best_value": study.best_value,
    }
    print(f"baseline: {len(study.trials)} trials in {summary['study_seconds']:.1f} s "
          f"(mean fit {sum(fit_seconds) / len(fit_seconds):.2f} s/trial), best {spec.metric} {study.best_value:.4f}")
    if args.summary:
        args.summary.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
