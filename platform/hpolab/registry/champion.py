"""The registry side before the gate: who holds the alias, whether the challenger already has a
version, and the holder's metrics on the challenger's test split (when the two are comparable)."""

from __future__ import annotations

import json

TAG_TRIAL_RUN = "hpolab.trial_run_id"  # on a version: the trial run it was promoted from


def alias_holder(client, model_name: str, alias: str):
    """The model version holding `alias`, or None when the model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(model_name, alias)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def existing_version(client, model_name: str, run_id: str):
    """The oldest version promoted from trial run `run_id` (promotion is idempotent), or None."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"name = '{model_name}'")
    except MlflowException:
        return None
    mine = [v for v in versions if v.tags.get(TAG_TRIAL_RUN) == run_id]
    return min(mine, key=lambda v: int(v.version)) if mine else None


def evaluate_holder(holder, model_name: str, experiment: str, config: dict, x_raw, y, bound, fp: str):
    """(metrics, None) or (None, why they are not comparable). `bound`: the challenger's task: the holder's
    served predictions on the same split are scored the same way."""
    import mlflow.pytorch

    from hpolab.registry.serving import TAG_EXPERIMENT, TAG_TASK, TAG_TEST_FINGERPRINT, predict_logits

    tags = holder.tags
    if tags.get(TAG_TEST_FINGERPRINT) != fp:
        if tags.get("hpolab.gate_source") is not None:  # scored by an experiment's evaluate() (candidate.Logged): no test split
            why = "it was scored by its experiment's evaluate(model, split), not on this test split"
        elif TAG_TEST_FINGERPRINT not in tags:
            why = "it carries no hpolab test fingerprint (it was not registered by hpolab promote)"
        elif tags.get(TAG_EXPERIMENT) != experiment:
            why = f"it comes from experiment {tags.get(TAG_EXPERIMENT)}, the challenger from {experiment}: no common test split"
        else:
            why = (f"its test split differs (seed {tags.get('hpolab.seed')}, data {tags.get('hpolab.data')}; the challenger's: "
                   f"seed {config['seed']}, data {json.dumps(config['data'], sort_keys=True)}): its score there could include its own training data")
        return None, why
    if tags.get(TAG_TASK, "classification") != bound.task.name:
        return None, f"it serves task {tags.get(TAG_TASK, 'classification')}, the challenger task {bound.task.name}"
    try:
        model = mlflow.pytorch.load_model(f"models:/{model_name}/{holder.version}", map_location="cpu")
        return bound.evaluate_served(predict_logits(model, x_raw), y), None
    except Exception as e:  # noqa: BLE001 -- reported; --force may still move the alias
        return None, f"loading/evaluating it failed: {type(e).__name__}: {e}"
