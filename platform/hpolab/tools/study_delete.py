"""`hpolab study delete NAME`: the Optuna study, its MLflow experiment (soft delete) and its local
folders, after a confirmation (or --yes); registered models are kept."""

from __future__ import annotations

import sys

from hpolab.errors import EXIT_OK, UserError
from hpolab.stores.paths import Stores, redact
from hpolab.stores.studies import delete_study, study_names


def delete_cmd(args, stores: Stores) -> int:
    names = study_names(stores)
    if args.name not in names:
        raise UserError(f"no study named {args.name!r} in {redact(stores.optuna_url)} (studies there: {', '.join(names) or 'none'})")
    what = (f"study {args.name!r}: its Optuna study in {redact(stores.optuna_url)}, its MLflow experiment in {redact(stores.tracking_uri)} "
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
        print(f"MLflow experiment {d.experiment_id} was already deleted")
    else:
        print(f"no MLflow experiment named {d.name!r} in {redact(stores.tracking_uri)}")
    for f in d.folders:
        print(f"removed {f}")
    print("registered models and their versions are kept")
    return EXIT_OK
