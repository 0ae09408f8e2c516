"""`hpolab study delete NAME`: the Optuna study, its MLflow experiment (soft delete, renamed so the
name is free, also when it was deleted already) and its local folders, after a confirmation (or --yes);
registered models are kept, with a warning when a version's source run is in that experiment."""

from __future__ import annotations

import sys

from hpolab.errors import EXIT_OK, UserError
from hpolab.stores.paths import Stores
from hpolab.stores.studies import delete_study, study_names


def delete_cmd(args, stores: Stores) -> int:
    names = study_names(stores)
    if args.name not in names:
        raise UserError(f"no study named {args.name!r} in {stores.optuna_shown} (studies there: {', '.join(names) or 'none'})")
    what = (f"study {args.name!r}: its Optuna study in {stores.optuna_shown}, its MLflow experiment in {stores.tracking_shown} "
            f"(soft delete) and {stores.trials_dir / args.name} and {stores.root / 'lr-find' / args.name}")
    if not args.yes:
        if not sys.stdin.isatty():
            raise UserError(f"deleting {what} needs confirmation: pass --yes (no terminal to ask on)")
        answer = input(f"Delete {what}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing deleted")
            return EXIT_OK
    d = delete_study(args.name, stores)
    print(f"deleted Optuna study {d.name!r} ({d.trials} trials)")
    if d.experiment_renamed_to:
        print(f"deleted MLflow experiment {d.experiment_id} (soft delete: renamed {d.experiment_renamed_to!r} so the name is free; "
              "it stays in MLflow's trash, with its runs and artifacts, until `mlflow gc` purges it)")
    elif d.experiment_id:
        print(f"MLflow experiment {d.experiment_id} was already deleted and renamed")
    if d.experiment_id:
        _warn_of_versions(stores, d.experiment_id)
    else:
        print(f"no MLflow experiment named {d.name!r} in {stores.tracking_shown}")
    for f in d.folders:
        print(f"removed {f}")
    print("registered models and their versions are kept")
    return EXIT_OK


def _warn_of_versions(stores: Stores, experiment_id: str) -> None:
    """One line on stderr when registered model versions have their source run in the deleted
    experiment: they load until `mlflow gc` purges it, then no more."""
    from hpolab.stores.mlflow_runs import client_for
    from hpolab.stores.retired_experiments import versions_sourced_in

    found = versions_sourced_in(client_for(stores), experiment_id)
    if found:
        shown = ", ".join(f"{name} version {version}" for name, version in found)
        print(f"hpolab: warning: {shown} {'has its' if len(found) == 1 else 'have their'} source run in deleted MLflow experiment "
              f"{experiment_id}: kept, but {'it stops' if len(found) == 1 else 'they stop'} loading once `mlflow gc` purges the "
              "experiment (promote again from a study that is kept, or don't gc it)", file=sys.stderr)
