"""A trial's final model in MLflow: the folder its trial process saved (study/trials/child_export.py), or,
where there is none, rebuilt here from its best checkpoint; logged with signature and example."""

from __future__ import annotations

from typing import Any


# What a logged model (a trial's, or promote's serving model) needs to load: torch runs it, torchvision
# may define its layers or preprocessing, numpy carries its inputs, mlflow loads it.
REQUIREMENTS = ("torch", "torchvision", "numpy", "mlflow")


def pip_requirements(env: dict[str, str]) -> list[str]:
    """REQUIREMENTS pinned to the versions in the env.* tags of the run that trained the model (the
    installed version where a tag is missing; local build suffixes such as +cpu dropped; torchvision
    left out when it was not installed). Explicit, so MLflow skips its own inference, which loads the
    model again (slow)."""
    from importlib import metadata

    def version(dist: str) -> str | None:
        value = env.get(f"env.{dist}")
        if not value:
            try:
                value = metadata.version(dist)
            except metadata.PackageNotFoundError:
                return None
        return None if value == "not installed" else value.split("+")[0]

    pins = {dist: version(dist) for dist in REQUIREMENTS}
    return [f"{dist}=={v}" for dist, v in pins.items() if v]


def new_run_model(client, run_id: str, name: str, tags: dict[str, str] | None = None):
    """Create the LoggedModel a `log_model(..., run_id=run_id, model_id=...)` call fills in.

    MLflow's `log_model(run_id=...)` alone files the model under the *active* experiment (the
    process-global one: "Default", id 0, whose artifacts go to ./mlruns/0/models), not under the
    run's. Creating the model here with the run's experiment id puts its record in the study's
    experiment and its files under that experiment's artifact root (the store's artifacts/), with
    no process-global state, so the driver's background logging thread is safe. The run's params
    are copied onto the model, as MLflow does when it creates the model itself.
    """
    run = client.get_run(run_id)
    return client.create_logged_model(
        experiment_id=run.info.experiment_id,
        name=name,
        source_run_id=run_id,
        tags={k: str(v) for k, v in (tags or {}).items()},
        params=dict(run.data.params),
    )


def model_from_checkpoint(experiment, config: dict[str, Any], info: dict[str, Any]):
    """The trial's model, built by its experiment and loaded from its best (else last) checkpoint, in
    eval mode on the CPU. `info`: the trial process's "done" summary."""
    from hpolab.train.checkpoint import load_checkpoint, load_model_state

    model = experiment.build_model(config["model"], tuple(info["input_shape"]), info["num_classes"])
    ckpt = load_checkpoint(info["best_checkpoint"] or info["last_checkpoint"], map_location="cpu")
    load_model_state(model, ckpt["state"]["model"])  # (the routine's state: checkpoint.py)
    return model.eval()


def log_trial_model(experiment, config: dict[str, Any], info: dict[str, Any], run_id: str, env: dict[str, str],
                    name: str = "model", tags: dict[str, str] | None = None) -> dict[str, str]:
    """Log the trial's best checkpoint as the run's model (`name`, `tags`: model_links.py); returns
    the tags that point at it.

    `info` is the trial process's "done" message: input_shape, num_classes, checkpoint paths, and a
    real input example with the model's output on it (for the signature).
    """
    import mlflow
    import mlflow.pytorch
    from mlflow.models import infer_signature

    model = model_from_checkpoint(experiment, config, info)
    client = mlflow.MlflowClient()  # the driver set the tracking URI; log_model resolves the same one
    logged = mlflow.pytorch.log_model(
        model,
        name=name,
        model_id=new_run_model(client, run_id, name, tags).model_id,
        input_example=info["input_example"],
        signature=infer_signature(info["input_example"], info["output_example"]),
        run_id=run_id,
        pip_requirements=pip_requirements(env),
    )
    return {"hpolab.model_uri": logged.model_uri, "hpolab.model_id": logged.model_id or ""}


class _SavedFolder:
    """A "flavor" for mlflow.models.Model.log whose save_model copies a folder mlflow.pytorch.save_model
    already wrote (in the trial process): Model.log then does everything else as for any model (the
    LoggedModel's artifacts, the run's outputs, the model's metrics) without exporting it again.
    Model.log's own MLmodel fields (model id, run id, artifact path, uuid, time) are kept; what the
    folder's MLmodel says about its content (flavors, signature, example, size) is copied onto them."""

    CONTENT = ("flavors", "signature", "saved_input_example_info", "model_size_bytes", "metadata", "env_vars")

    @staticmethod
    def save_model(path, mlflow_model, saved_dir, source_run_id, **_):
        import shutil

        from mlflow.models import Model

        shutil.copytree(saved_dir, path)
        saved = Model.load(saved_dir)
        for field in _SavedFolder.CONTENT:
            setattr(mlflow_model, field, getattr(saved, field, None))
        mlflow_model.run_id = source_run_id  # (Model.log is not given the run: log_saved_model says why)
        mlflow_model.save(f"{path}/MLmodel")


def log_saved_model(saved_dir: str, run_id: str, name: str = "model", tags: dict[str, str] | None = None) -> dict[str, str]:
    """Log a model folder the trial process saved (and checked: it loaded it back and predicted) as the
    run's model; returns the tags that point at it, as log_trial_model does."""
    import mlflow
    from mlflow.models import Model

    from mlflow.entities import LoggedModelOutput

    client = mlflow.MlflowClient()  # the driver set the tracking URI; Model.log resolves the same one
    # Model.log(run_id=...) would also link the run's metrics of step 0 to the model, reading the run
    # and every metric's history to find them (a `runs/get`, a `metrics/get-history` per metric and a
    # `log-batch`: ~11 requests a model), and a trial logs no step 0 (its epochs are 1-based;
    # model_links.py links the model's epoch). So the run is named here instead: the model's record
    # (source_run_id, new_run_model), its MLmodel (_SavedFolder), and the run's outputs.
    logged = Model.log(artifact_path=None, name=name, flavor=_SavedFolder, saved_dir=saved_dir, source_run_id=run_id,
                       model_id=new_run_model(client, run_id, name, tags).model_id,
                       validate_serving_input=False)  # the trial process did (child_export.save_model)
    client.log_outputs(run_id=run_id, models=[LoggedModelOutput(logged.model_id, step=0)])
    return {"hpolab.model_uri": logged.model_uri, "hpolab.model_id": logged.model_id or ""}
