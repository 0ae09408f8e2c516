"""`hpolab lr-find SPEC`: the LR range test run in this process, logged to the study's experiment.

The work is `hpolab.study.lr_test.lr_range` (shared with the driver); this is the command around it.
"""

from __future__ import annotations

from pathlib import Path

from hpolab.study.lr_test.lr_range import RUN_NAME, LRRangeResult, log_to_mlflow, run_lr_find, summary_text


def find_study_run(client, stores, spec) -> tuple[str, str | None]:
    """(experiment id, the study's parent run id or None) for logging a stand-alone `hpolab lr-find`.

    The experiment is the study's (created when missing); the parent run is the Optuna study's
    user attr `mlflow_parent_run_id` when the study exists in the store. Reads Optuna, writes nothing
    there (and does not create an Optuna DB that does not exist yet).
    """
    from hpolab.stores import mlflow_runs as tr

    experiment_id = tr.get_or_create_experiment(client, spec.name, stores)
    parent = None
    url, db = stores.optuna_url, stores.optuna_db
    if db is None or db.is_file():  # an embedded DB that does not exist holds no study (and is not created)
        import optuna

        try:
            study = optuna.load_study(study_name=spec.name, storage=url)
            parent = study.user_attrs.get("mlflow_parent_run_id")
        except KeyError:  # no such study yet
            parent = None
    if parent:
        try:
            client.get_run(parent)
        except Exception:
            parent = None  # the MLflow store was reset since
    return experiment_id, parent


def lr_find_and_log(spec, stores, out_dir: str | Path | None = None, threads: int | None = None) -> tuple[LRRangeResult, dict[str, Path], str]:
    """`hpolab lr-find SPEC`: run in this process, then log to the study's MLflow experiment.

    Returns (result, paths, run id). The driver does not use this: it runs `run_in_process` and
    logs with `log_to_mlflow` itself.
    """
    from hpolab.stores.paths import ensure_local
    from hpolab.stores import mlflow_runs as tr

    ensure_local(stores)
    result, paths = run_lr_find(spec, stores, out_dir, threads)
    client = tr.client_for(stores)
    experiment_id, parent = find_study_run(client, stores, spec)
    run_id = log_to_mlflow(client, experiment_id, parent, result, paths["plot"].parent, {"optuna.study": spec.name})
    return result, paths, run_id


def lr_find_cmd(args, stores) -> int:
    """`hpolab lr-find SPEC [key=value ...] [--out DIR]` (args from the CLI's parser).

    Prints the summary, where the plot/CSV went and the MLflow run. Exit code 0 with a suggestion,
    1 when the curve gave none (the warning says why). Spec errors propagate (the CLI reports them).
    """
    from hpolab.config.spec import load_spec

    spec = load_spec(args.spec, list(getattr(args, "overrides", None) or []))
    out = Path(args.out) if getattr(args, "out", None) else None
    result, _, _ = lr_find_and_print(spec, stores, out)
    return 0 if result.suggestion is not None else 1


def lr_find_and_print(spec, stores, out: Path | None = None) -> tuple[LRRangeResult, dict[str, Path], str]:
    """lr_find_and_log, then its summary, where the plot/CSV went and the MLflow run, printed (the
    CLI's `hpolab lr-find` and hpolab.lr_find)."""
    result, paths, run_id = lr_find_and_log(spec, stores, out)
    print(summary_text(result))
    print(f"plot: {paths['plot']}")
    print(f"csv:  {paths['csv']}")
    print(f"mlflow run: {run_id} ({RUN_NAME}, experiment {spec.name!r})")
    return result, paths, run_id
