"""A trial's final model in MLflow: rebuilt from its best checkpoint, logged with signature and example."""

from __future__ import annotations

from typing import Any


def warm_exporter() -> None:
    """Import what log_model needs (torch.export, seconds) ahead of the first completed trial."""
    try:
        import mlflow.pytorch  # noqa: F401
        import torch.export  # noqa: F401
    except Exception:
        pass  # only a warm-up: a real problem shows when the model is logged


def pip_requirements(env: dict[str, str]) -> list[str]:
    """Explicit requirements from the env tags: MLflow's own inference loads the model again (slow)."""
    reqs = [f"torch=={env['env.torch'].split('+')[0]}", f"mlflow=={env['env.mlflow']}"]
    if env.get("env.torchvision", "not installed") != "not installed":
        reqs.append(f"torchvision=={env['env.torchvision'].split('+')[0]}")
    return reqs


def log_trial_model(experiment, config: dict[str, Any], info: dict[str, Any], run_id: str, env: dict[str, str]) -> dict[str, str]:
    """Log the trial's best checkpoint as the run's model; returns the tags that point at it.

    `info` is the trial process's "done" message: input_shape, num_classes, checkpoint paths, and a
    real input example with the model's output on it (for the signature).
    """
    import mlflow.pytorch
    from mlflow.models import infer_signature

    from hpolab.train.checkpoint import load_checkpoint, load_model_state

    model = experiment.build_model(config["model"], tuple(info["input_shape"]), info["num_classes"])
    ckpt = load_checkpoint(info["best_checkpoint"] or info["last_checkpoint"], map_location="cpu")
    load_model_state(model, ckpt["model"])
    model.eval()
    logged = mlflow.pytorch.log_model(
        model,
        name="model",
        input_example=info["input_example"],
        signature=infer_signature(info["input_example"], info["output_example"]),
        run_id=run_id,
        pip_requirements=pip_requirements(env),
    )
    return {"hpolab.model_uri": logged.model_uri, "hpolab.model_id": logged.model_id or ""}
