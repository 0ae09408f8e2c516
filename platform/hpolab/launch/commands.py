"""The `hpolab launch slurm|k8s` subcommands: their arguments and handlers (cli.py wires them in)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hpolab.errors import UserError

from hpolab.launch.workers import (WorkerCommand, check_shared, follow_flags, hpolab_executable, launch_credentials,
                                   launch_stores, prepare_stores, spec_path_for_workers)


def add_launch_parsers(sub, command) -> None:
    """`launch slurm` and `launch k8s` under `sub`; `command(subparsers, name, help)` adds the store flags."""
    launch = sub.add_parser("launch", help="run workers of a study on a cluster scheduler (Slurm, Kubernetes)")
    lsub = launch.add_subparsers(dest="launch_command", metavar="SCHEDULER")
    lsub.required = True
    p = command(lsub, "slurm", "submit N workers of a study as one sbatch array job (one `hpolab worker` per array task)")
    _common(p)
    p.add_argument("--cpus-per-worker", type=int, metavar="C", help="--cpus-per-task of each array task (default: the partition's)")
    p.add_argument("--partition", metavar="P", help="Slurm partition to submit to (default: the cluster's default)")
    p.add_argument("--time", metavar="HH:MM:SS", help="time limit of each array task")
    p.add_argument("--requeue", action="store_true", help="let Slurm requeue a preempted or failed-node task (it rejoins the study)")
    p.add_argument("--single-node", action="store_true",
                   help="keep every array task on one node (--nodelist, default this host's short name): allows a SQLite store")
    p.add_argument("--nodelist", metavar="NODE", help="the node for --single-node")
    p.add_argument("--log-dir", default="slurm-logs", metavar="DIR", help="where the script and the task logs go (default ./slurm-logs)")
    p.add_argument("--dry-run", action="store_true", help="print the sbatch script; submit nothing")
    p = command(lsub, "k8s", "write Kubernetes manifests: an Indexed Job of N workers (+ NetworkPolicy, optional stores)")
    _common(p)
    p.add_argument("--image", required=True, help="container image with hpolab and the project (see the Dockerfile)")
    p.add_argument("--namespace", default="hpolab", metavar="NS", help="Kubernetes namespace of every manifest")
    p.add_argument("--secret", default="hpolab-stores", metavar="NAME",
                   help="Secret holding OPTUNA_STORAGE and MLFLOW_TRACKING_URI (and optional MLflow credentials)")
    p.add_argument("--with-stores", action="store_true", help="also write a PostgreSQL and an MLflow server for a cluster that has none")
    p.add_argument("--out", default="k8s", metavar="DIR", help="folder for the manifests (default ./k8s)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="study spec YAML, e.g. studies/digits_cnn.yaml")
    p.add_argument("overrides", nargs="*", help="key=value overrides every worker applies, e.g. n_trials=40")
    p.add_argument("--workers", type=int, required=True, metavar="N", help="how many workers (each runs `parallel` trials at once)")
    p.add_argument("--gpus-per-worker", type=int, default=0, metavar="G",
                   help="GPUs per worker (Slurm --gres=gpu:G, Kubernetes nvidia.com/gpu); the worker places its trials on them")


def _worker_command(args, stores, cwd: Path) -> WorkerCommand:
    return WorkerCommand(hpolab_executable(), spec_path_for_workers(args.spec, cwd), tuple(args.overrides),
                         store=str(stores.root))


def cmd_launch_slurm(args) -> int:
    from hpolab.config.spec import load_spec
    from hpolab.launch import slurm

    cwd = Path.cwd().resolve()
    opts = slurm.SlurmOptions(workers=args.workers, gpus_per_worker=args.gpus_per_worker, cpus_per_worker=args.cpus_per_worker,
                              partition=args.partition, time=args.time, requeue=args.requeue, single_node=args.single_node,
                              nodelist=args.nodelist, log_dir=args.log_dir)
    slurm.check_options(opts)
    spec = load_spec(args.spec, args.overrides)  # a bad spec fails here, not in N array tasks
    stores = launch_stores(getattr(args, "store", None), getattr(args, "storage", None), getattr(args, "tracking_uri", None), cwd)
    check_shared(stores, args.single_node, "pass --single-node to keep every array task on one node")
    credentials = launch_credentials(cwd)
    script = slurm.render_script(spec.name, _worker_command(args, stores, cwd), stores, opts, cwd, tuple(credentials))
    if args.dry_run:
        print(script, end="")
        return 0
    from hpolab.stores.preflight import check_stores

    os.environ.update(credentials)  # this process's own checks log in to the MLflow server the jobs use
    check_stores(stores)  # a wrong or down store is said now, not in every array task's log
    prepare_stores(stores)
    record_code(stores, spec)  # a worker whose experiment module differs from this host's refuses to run
    job_id = slurm.submit(script, spec.name, stores, opts, cwd, credentials)
    print(slurm.follow_text(job_id, spec.name, opts, cwd, *follow_flags(stores, cwd)))
    return 0


def record_code(stores, spec) -> None:
    """On the submit host, before any worker starts: the study records the experiment module's hash and
    the project it was imported from (study/driver/code_guard.py); UserError if the study ran other code."""
    import optuna

    from hpolab.config.experiment import load_experiment
    from hpolab.config.experiment_code import code_of
    from hpolab.stores.optuna_storage import make_storage
    from hpolab.study.driver.code_guard import record_at_launch

    module = load_experiment(spec.experiment)  # load_spec imported it from the spec's project (the import check)
    study = optuna.create_study(storage=make_storage(stores), study_name=spec.name,
                                directions=[o.direction for o in spec.objective_list],
                                load_if_exists=True)
    record_at_launch(study, code_of(module, spec.experiment))


def cmd_launch_k8s(args) -> int:
    from hpolab.config.spec import load_spec
    from hpolab.launch import k8s

    cwd = Path.cwd().resolve()
    spec = load_spec(args.spec, args.overrides)
    opts = k8s.K8sOptions(workers=args.workers, image=args.image, gpus_per_worker=args.gpus_per_worker,
                          namespace=args.namespace, secret=args.secret, with_stores=args.with_stores)
    k8s.check_options(opts)
    spec_path = spec_path_for_workers(args.spec, cwd)
    if Path(spec_path).is_absolute():
        raise UserError(f"spec {args.spec}: run `hpolab launch k8s` from the project folder the image was built from "
                        "(the pods run the spec by its path inside the image, e.g. studies/x.yaml)")
    command = WorkerCommand(["hpolab"], spec_path, tuple(args.overrides), store="/work/mlruns")
    paths = k8s.write_manifests(Path(args.out), spec.name, command, opts)
    secret = None
    if opts.with_stores:  # the stores' passwords, for the Secret: written here, beside the manifests
        from hpolab.launch.k8s_secret import write_stores_env

        secret = write_stores_env(Path(args.out))
    print(k8s.next_steps(paths, spec.name, opts, secret))
    return 0
