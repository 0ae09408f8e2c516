"""`hpolab` command line: parse, validate, call one function, return an exit code.

Exit codes: 0 success; 1 the work failed; 2 bad input (spec, arguments, missing study);
3 promotion refused (the challenger is not better than the alias holder);
130 interrupted by Ctrl-C, 143 by SIGTERM (the stores are consistent; re-run to continue).
`study run` / `worker`: 0 only when the budget was reached (or the study timeout hit) with at least
one COMPLETE trial; 1 when no trial completed or max_failures consecutive trials failed.
"""

from __future__ import annotations

import argparse
import os
import sys

from hpolab.launch.commands import add_launch_parsers, cmd_launch_k8s, cmd_launch_slurm
from hpolab.stores.paths import redact
from hpolab.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, SpecError, StudyError, UserError

# `study status` shows every trial of a study up to this many; above, the best, the running and the
# latest (a 1,000-row table took seconds to render and is no one's overview); --all shows them all.
STATUS_ROWS = 50
CONTROL_COMMANDS = ("pause", "resume", "stop", "set")


def _add_store_options(p: argparse.ArgumentParser, suppress: bool) -> None:
    d = argparse.SUPPRESS if suppress else None
    p.add_argument("--store", default=d, metavar="DIR", help="local store folder (default ./mlruns): optuna.db, mlflow.db, artifacts/")
    p.add_argument("--storage", default=d, metavar="URL", help="Optuna storage URL (default: env OPTUNA_STORAGE, else sqlite in the store)")
    p.add_argument("--tracking-uri", default=d, metavar="URI", help="MLflow tracking URI (default: env MLFLOW_TRACKING_URI, else sqlite in the store)")


def _add_spec_arguments(p: argparse.ArgumentParser, overrides: str = "key=value overrides, e.g. n_trials=4 trainer.lr=0.01") -> None:
    p.add_argument("spec", help="study spec YAML, e.g. studies/digits_cnn.yaml")
    p.add_argument("overrides", nargs="*", help=overrides + " (typed like YAML; before or after the options)")


def _add_spec_change_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--new-study", metavar="NAME", help="run this spec as a new study named NAME (e.g. after editing the spec of an existing study)")
    p.add_argument("--allow-spec-change", action="store_true",
                   help="continue an existing study with a changed spec (recorded as spec-<n>.yaml); refused if a sampled value no longer fits the search space")
    p.add_argument("--allow-code-change", action="store_true",
                   help="continue an existing study although its experiment module changed (hash differs); each trial run records the code it ran")
    p.add_argument("--hide-trial-output", action="store_true",
                   help="what trials print goes to their output.log (on each run) only, not to this console as `trial N | ...`")


def _command(subparsers, name: str, help_: str) -> argparse.ArgumentParser:
    p = subparsers.add_parser(name, help=help_, description=help_)
    _add_store_options(p, suppress=True)
    return p


def _add_study_commands(sub) -> None:
    study = sub.add_parser("study", help="run, inspect, steer or validate a study")
    ssub = study.add_subparsers(dest="study_command", metavar="SUBCOMMAND")
    ssub.required = True
    p = _command(ssub, "run", "run (or continue) a study up to its n_trials budget")
    _add_spec_arguments(p)
    _add_spec_change_options(p)
    p = _command(ssub, "status", "trial table of a study, from the stores")
    p.add_argument("name", metavar="NAME|SPEC", help="study name, or its spec file (its name: is used)")
    p.add_argument("--all", action="store_true", help=f"every trial (default: all up to {STATUS_ROWS}; above that the "
                   "best, the running and waiting, and the latest ones)")
    p = _command(ssub, "check", "list every disagreement between the study's Optuna trials and MLflow runs (exit 1 if any)")
    p.add_argument("name", metavar="NAME|SPEC", help="study name, or its spec file (its name: is used)")
    p.add_argument("--repair", action="store_true", help="fix what can be fixed without deleting anything, and say what was done")
    p.add_argument("--json", action="store_true", help="print the problems as a JSON list")
    _command(ssub, "list", "the studies in the store: direction, metric, trials by state, best value, last activity")
    p = _command(ssub, "delete", "delete a study: its Optuna study, its MLflow experiment (soft delete) and its local trial folders")
    p.add_argument("name", metavar="NAME|SPEC", help="study name, or its spec file")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation (needed without a terminal)")
    p = _command(ssub, "prune-files", "delete the checkpoints and models the default retention would not keep (says what, asks)")
    p.add_argument("name", metavar="NAME|SPEC", help="study name, or its spec file")
    p.add_argument("--keep", type=int, default=5, metavar="N", help="keep the N best COMPLETE trials' files (default 5)")
    p.add_argument("--yes", "-y", action="store_true", help="delete without asking (needed without a terminal)")
    p = _command(ssub, "validate", "check a spec and print the resolved version")
    _add_spec_arguments(p, "key=value overrides to check with it, e.g. trainer.lr=0.01")
    _add_control_commands(ssub)


def _add_control_commands(ssub) -> None:
    """study pause | resume | stop | set: steer a running study on every worker (tools/study_control.py)."""
    for name, help_ in (("pause", "pause a study on every worker: no new trials or resumes; running trials go on"),
                        ("resume", "resume a paused or stopped study: its workers start trials again"),
                        ("stop", "stop a study on every worker: no new trials, running trials finish, then each worker exits 0"),
                        ("set", "change a running study's run controls on every worker: n_trials, parallel, timeout, trial_timeout, "
                                "budget.epochs, max_failures")):
        p = _command(ssub, name, help_)
        p.add_argument("name", metavar="NAME|SPEC", help="study name, or its spec file (its name: is used)")
        if name == "stop":
            p.add_argument("--now", action="store_true", help="stop running trials after their current epoch (as Ctrl-C does: "
                           "resumable after `study resume`) instead of letting them finish")
        if name == "set":
            p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. n_trials=60 parallel=1 timeout=2h budget.epochs=400")


def _add_run_commands(sub) -> None:
    """worker, ui, env, doctor, reproduce, lr-find."""
    p = _command(sub, "worker", "join a study as one more worker (same as `study run`)")
    _add_spec_arguments(p, "key=value overrides, the same as the other workers'")
    _add_spec_change_options(p)

    p = _command(sub, "ui", "serve the MLflow UI for the store in use")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only; the UI has no login)")
    p.add_argument("--port", type=int, default=5000, help="TCP port to listen on")

    _command(sub, "env", "check the install: versions, CUDA, a matmul on the device")

    p = _command(sub, "doctor", "sanity checks before a costly study: data, model, can it overfit a tiny batch?")
    _add_spec_arguments(p, "key=value overrides to check with it, e.g. trainer.batch_size=32")

    p = _command(sub, "reproduce", "train a trial again from its MLflow run and compare the metrics")
    p.add_argument("run_id", help="an MLflow run id of a trial (hpolab compare NAME shows them)")
    p.add_argument("--tolerance", type=float, default=0.0, help="largest accepted abs difference per metric (default 0: identical)")
    p.add_argument("--allow-code-change", action="store_true",
                   help="retrain with the importable experiment module although its hash differs from the code the run recorded")

    p = _command(sub, "lr-find", "LR range test (Leslie Smith) on the spec's experiment")
    _add_spec_arguments(p, "key=value overrides, e.g. lr_range_test.num_steps=200")
    p.add_argument("--out", metavar="DIR", help="where to write the plot and CSV (default: STORE/lr-find/NAME)")


def _add_result_commands(sub) -> None:
    """promote, predict, compare, storage-proxy, report."""
    p = _command(sub, "promote", "register the best trial's model under an alias, behind a held-out test gate")
    p.add_argument("name", metavar="NAME|SPEC", help="study name, or its spec file (its experiment is then found from the spec's project)")
    p.add_argument("--metric", help="pick the best trial by this logged metric instead of the study's")
    p.add_argument("--pick", metavar="RULE", help="several objectives: choose from the Pareto front, e.g. "
                   "\"val_acc>=0.97; min latency_ms\" (default: the front's knee)")
    p.add_argument("--model-name", help="registered model name (default: the study name)")
    p.add_argument("--alias", default="champion", help="registry alias to move to the new version")
    p.add_argument("--force", action="store_true", help="move the alias even if the challenger is not better")
    p.add_argument("--dry-run", action="store_true", help="print what would happen (the race's plan, the plain pick's gate); write nothing")
    p.add_argument("--race-top", type=int, metavar="K", help="race the top K trials (and the champion's configuration) "
                   "on fresh seeds before the gate (default: the spec's promotion.race_top, 3)")
    p.add_argument("--race-seeds", type=int, metavar="N", help="the race's seed budget: at most N seeds per candidate "
                   "(default: the spec's promotion.race_seeds, 5)")
    p.add_argument("--no-race", action="store_true", help="no race: promote the best trial by its value on the study's one seed")

    p = _command(sub, "predict", "predict with a registered model, using its experiment's preprocessing")
    p.add_argument("model_uri", help="e.g. models:/digits-cnn@champion")
    p.add_argument("input", help="a .npy of raw inputs, or a folder of images")
    p.add_argument("--out", help="write predictions to this .csv/.npy instead of printing")

    p = _command(sub, "compare", "compare the trials of a study, or any runs by id")
    p.add_argument("targets", nargs="+", metavar="NAME|SPEC|RUN_ID", help="a study name or spec file, or two or more MLflow run ids")
    p.add_argument("--top", type=int, help="only the K best rows")
    p.add_argument("--sort", metavar="METRIC", help="sort by this column, metric or param; METRIC:asc|desc forces the order (default: the study metric)")
    p.add_argument("--state", default="all", choices=["complete", "pruned", "fail", "all"], help="only the trials in this state")
    p.add_argument("--format", default="table", choices=["table", "csv", "json", "markdown"],
                   help="table (fits the terminal), markdown (the same columns), csv or json (every column, full precision)")

    p = _command(sub, "storage-proxy", "serve the Optuna storage (--storage) to many workers over gRPC")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback; the proxy has no login or TLS)")
    p.add_argument("--allow-unauthenticated-remote", action="store_true", help="allow another --host: anyone who reaches it can change every study")
    p.add_argument("--port", type=int, default=13000, help="TCP port to listen on")

    add_launch_parsers(sub, _command)

    p = _command(sub, "report", "a self-contained HTML report of a study")
    p.add_argument("name", metavar="NAME|SPEC", help="study name, or its spec file")
    p.add_argument("--out", metavar="FILE", help="default: STORE/reports/NAME.html")
    p.add_argument("--ui-url", metavar="URL", help="link trials' runs and logged models to the MLflow UI at this address, "
                   "e.g. http://127.0.0.1:5000 (hpolab ui's; default: the tracking server's, else the models:/ URI is shown)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpolab", description="Hyperparameter studies for PyTorch on Optuna + MLflow.")
    _add_store_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    # in this order in `hpolab --help`
    _add_study_commands(sub)
    _add_run_commands(sub)
    _add_result_commands(sub)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with `key=value` overrides on either side of the command's options
    (`study run SPEC --store DIR n_trials=3`). argparse fills `spec overrides*` from the first run of
    positionals only and calls the rest unrecognized; its parse_intermixed_args refuses subcommands.
    So: parse what it knows, then give the leftovers to a command that takes overrides, in order."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and not any(a.startswith("-") for a in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _stores(args, optuna: bool = True, tracking: bool = True, create: bool = True):
    """The stores of the command line/environment, checked before use (one line, within seconds, if
    a URL is malformed, a driver is missing or a server does not answer). optuna/tracking: which of
    the two the command opens (False, False: resolve only); `create` False: a command that reads a
    study through MLflow or Optuna (opening an embedded store's database would create it): it must exist."""
    from hpolab.api.stores import open_stores

    return open_stores(getattr(args, "store", None), getattr(args, "storage", None), getattr(args, "tracking_uri", None), optuna, tracking,
                       create)


def cmd_study_run(args) -> int:
    """`study run` / `worker`: hpolab.run_study's code path (api/running.py), its Outcome as an exit code."""
    stores = _stores(args)  # first: a wrong or down store is said in seconds, before torch/mlflow are imported
    from hpolab.api import running, specs
    from hpolab.study.driver.progress import Progress, process_started
    from hpolab.study.trials import trial_forkserver

    # The forkserver is a fork of this process once the spec check has imported torch and the experiment
    # (this process holds nothing else: a notebook's or a script's gets a new interpreter instead).
    trial_forkserver.allow_fork()
    started = process_started()  # "elapsed" is this command's wall time

    def progress(spec) -> Progress:
        return Progress(spec, trial_output=not args.hide_trial_output, started=started)

    run = running.drive(args.spec, specs.override_strings(args.overrides, args.new_study), stores, progress,
                        worker=args.command == "worker", allow_spec_change=args.allow_spec_change,
                        allow_code_change=args.allow_code_change, command=True)
    code, message = running.study_exit(run.outcome, stores)
    if message:
        print(f"hpolab: {message}", file=sys.stderr)
    return code


def cmd_study_validate(args) -> int:
    from hpolab.config.spec import load_spec, spec_to_yaml

    spec = load_spec(args.spec, args.overrides)
    print(f"# {args.spec}: valid")
    print(spec_to_yaml(spec), end="")
    return EXIT_OK


def cmd_study_status(args) -> int:
    stores = _stores(args)  # checked before the heavy imports: a bad store is said in seconds
    from hpolab.analysis.status import print_status
    from hpolab.stores.preflight import require_existing

    require_existing(stores, tracking=False)  # (it reads Optuna only; opening a missing file would create it)

    return print_status(args.name, stores, limit=None if args.all else STATUS_ROWS)


def cmd_study_check(args) -> int:
    stores = _stores(args, create=False)
    from hpolab.analysis.check import check_cmd

    return check_cmd(args, stores)


def cmd_study_prune_files(args) -> int:
    stores = _stores(args, create=False)
    from hpolab.study.retention.prune_files import prune_files_cmd

    return prune_files_cmd(args, stores)


def cmd_study_control(args) -> int:
    stores = _stores(args, tracking=False)  # the control lives in the Optuna storage
    from hpolab.tools.study_control import control_cmd

    return control_cmd(args, stores)


def cmd_study_list(args) -> int:
    stores = _stores(args)
    from hpolab.analysis.status import print_study_list

    return print_study_list(stores)


def cmd_study_delete(args) -> int:
    stores = _stores(args, create=False)
    from hpolab.tools.study_delete import delete_cmd

    return delete_cmd(args, stores)


def cmd_ui(args) -> int:
    from hpolab.tools.ui import check_address, serve

    check_address(args.host, args.port)  # a bad or busy port is said before the store is opened
    return serve(_stores(args, optuna=False, create=False), host=args.host, port=args.port)


def cmd_env(args) -> int:
    from hpolab.tools.envcheck import run_env_check

    return run_env_check()


# Commands whose module exposes `<name>(args, stores) -> exit code`; imported only when used, so
# `hpolab --help` and light commands do not pay for torch/mlflow imports.
STORE_COMMANDS = {
    "doctor": "hpolab.tools.doctor:doctor_cmd",  # writes to no store: not checked
    "reproduce": "hpolab.analysis.reproduce:reproduce_cmd",
    "lr-find": "hpolab.tools.lr_find:lr_find_cmd",
    "promote": "hpolab.registry.promote:promote_cmd",
    "predict": "hpolab.registry.predict:predict_cmd",
    "compare": "hpolab.analysis.compare.command:compare_cmd",
    "report": "hpolab.analysis.report.command:report_cmd",
    "storage-proxy": "hpolab.tools.storage_proxy:storage_proxy_cmd",
}


def _store_command(name: str, target: str):
    import importlib

    module, func = target.split(":")

    # Which stores each command opens: doctor none, predict only MLflow (models:/ URIs), the rest both.
    # storage-proxy serves the database (checked) and opens no MLflow store.
    needs = {"doctor": (False, False), "predict": (False, True), "storage-proxy": (True, False)}.get(name, (True, True))

    def handler(args) -> int:
        # before the command's (heavy) imports: a bad store is said in seconds
        stores = _stores(args, *needs, create=name in ("doctor", "lr-find", "storage-proxy"))  # (the others read a study)
        return getattr(importlib.import_module(module), func)(args, stores)

    return handler


def _resolve_study_names(args) -> None:
    """A spec path where a study is named: use its `name:`. promote also imports the spec's
    experiment from the spec's project (it rebuilds the model); compare converts only files."""

    def name_of(arg: str, full: bool = False) -> str:
        if not arg.lower().endswith((".yaml", ".yml")):
            return arg  # a plain name or a run id: no need to import the spec machinery
        from hpolab.config.spec import study_name_from

        return study_name_from(arg, full=full)

    command = (args.command, getattr(args, "study_command", None))
    if command in (("study", "status"), ("study", "check"), ("study", "delete"), ("study", "prune-files"), ("report", None),
                   *(("study", c) for c in CONTROL_COMMANDS)):
        args.name = name_of(args.name)
    elif command == ("promote", None):
        args.name = name_of(args.name, full=True)
    elif command == ("compare", None):
        args.targets = [name_of(t) for t in args.targets]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handler = {
        ("study", "run"): cmd_study_run,
        ("study", "status"): cmd_study_status,
        ("study", "check"): cmd_study_check,
        ("study", "list"): cmd_study_list,
        ("study", "delete"): cmd_study_delete,
        ("study", "prune-files"): cmd_study_prune_files,
        ("study", "validate"): cmd_study_validate,
        **{("study", c): cmd_study_control for c in CONTROL_COMMANDS},
        ("worker", None): cmd_study_run,
        ("ui", None): cmd_ui,
        ("env", None): cmd_env,
        ("launch", "slurm"): cmd_launch_slurm,
        ("launch", "k8s"): cmd_launch_k8s,
        **{(name, None): _store_command(name, target) for name, target in STORE_COMMANDS.items()},
    }[(args.command, getattr(args, "study_command", None) or getattr(args, "launch_command", None))]
    try:
        _resolve_study_names(args)
        return handler(args)
    except SpecError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_BAD_INPUT
    except (UserError, StudyError) as e:  # redacted again: a library's message may quote a store URL
        print(f"hpolab: {redact(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT if isinstance(e, UserError) else EXIT_FAILED
    except KeyboardInterrupt:
        print("hpolab: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # a broken pipe of something else (a child, a socket) is a real error
        # `hpolab compare NAME | head`: the reader of our stdout left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports POLLERR on its write end)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


if __name__ == "__main__":  # `python -m hpolab.cli` (tests run it in-process to look at sys.modules after)
    sys.exit(main())
