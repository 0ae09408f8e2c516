"""`hpolab study check NAME`: do the study's two stores tell the same story?

Optuna's state is the truth; MLflow records it. Read in bulk (the study's trials once, one paged
search over the experiment's runs, one over its logged models, a stat per uploaded checkpoint), so
a study of hundreds of trials is checked in seconds. Every disagreement is a `Problem` (trial,
what, fix); those with a `repair` are fixed by `--repair` without deleting anything (check_fixes.py).

What is checked:
- each started trial has its MLflow run (user attr `mlflow_run_id`), not deleted, tagged with its
  trial number, under the study's parent run;
- the states agree: a finished trial's run has `hpolab.state` = Optuna's state and the matching
  status (COMPLETE: FINISHED, PRUNED: KILLED, FAIL: FAILED, with a `hpolab.fail_reason`); an
  interrupted attempt (Ctrl-C, SIGTERM, a dead driver) is queued to resume (a retry copy);
- a retry's run names the attempt it continues (`hpolab.retry_of_trial`, `hpolab.retry_of_run`);
- no RUNNING trial without a live owner (owners.py; heartbeats for another host's);
- no run claims a trial that does not point at it;
- the parent run (study user attr `mlflow_parent_run_id`) is closed when no worker runs, with the
  study's counts; no more finished trials than `n_trials`;
- uploaded checkpoints (`hpolab.checkpoint_epoch`) and logged models (`hpolab.model_id`) exist,
  unless retention deleted them; a COMPLETE trial has a model or says why not.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpolab.stores.paths import Stores

MLFLOW_STATUS = {TrialState.COMPLETE: "FINISHED", TrialState.PRUNED: "KILLED", TrialState.FAIL: "FAILED"}
# Attempts that did not fail by their own doing: they are queued to resume (a retry copy).
INTERRUPT_KINDS = ("interrupted", "driver", "owner_gone", "stale")
BY_CHECK = "(recorded by hpolab study check)"


@dataclass
class Problem:
    trial: int | None  # None: the study as a whole
    what: str
    fix: str
    repair: Callable[[], str] | None = field(default=None, repr=False)  # does the fix; returns what it did

    def as_dict(self) -> dict[str, Any]:
        return {"trial": self.trial, "what": self.what, "fix": self.fix, "repairable": self.repair is not None}


@dataclass
class Study:
    """Both stores of one study, read once."""

    name: str
    stores: Stores
    study: optuna.Study
    client: Any
    experiment_id: str | None
    runs: dict[str, Any]  # run id -> Run (deleted runs too)
    models: dict[str, Any]  # logged model id -> LoggedModel
    trials: list[FrozenTrial]
    parent_id: str | None
    live: set[int] = field(default_factory=set)  # RUNNING trials whose owner may be alive

    @property
    def storage(self):
        return self.study._storage


def read_study(name: str, stores: Stores) -> Study:
    from mlflow.entities import ViewType

    from hpolab.stores.mlflow_runs import client_for
    from hpolab.stores.optuna_storage import load_study, make_storage

    load_study(name, stores)  # an unknown study or store: one line (UserError), exit 2
    with warnings.catch_warnings():  # heartbeat settings (to tell stale trials) are "experimental"
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.load_study(study_name=name, storage=make_storage(stores.optuna_url))
    client = client_for(stores)
    exp = client.get_experiment_by_name(name)
    runs: dict[str, Any] = {}
    models: dict[str, Any] = {}
    if exp is not None:
        token = None
        while True:
            page = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=1000, page_token=token)
            runs.update((r.info.run_id, r) for r in page)
            token = page.token
            if not token:
                break
        token = None
        while True:
            page = client.search_logged_models([exp.experiment_id], max_results=1000, page_token=token)
            models.update((m.model_id, m) for m in page)
            token = page.token
            if not token:
                break
    return Study(name, stores, study, client, exp.experiment_id if exp else None, runs, models,
                 study.get_trials(deepcopy=False), study.user_attrs.get("mlflow_parent_run_id"))


def find_problems(s: Study) -> list[Problem]:
    from hpolab.analysis import check_fixes as fx

    if not s.trials:
        return []
    if s.experiment_id is None:
        return [Problem(None, f"no MLflow experiment named {s.name!r}, but {len(s.trials)} Optuna trials",
                        "point --tracking-uri at the study's MLflow store")]
    out = fx.running_problems(s)
    for t in s.trials:
        out += fx.trial_problems(s, t)
    out += fx.orphan_runs(s)
    out += fx.parent_problems(s)
    return out


def _print_table(problems: list[Problem], name: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=200 if not Console().is_terminal else None)
    table = Table(title=f"study {name}: {len(problems)} disagreement{'s' * (len(problems) != 1)} between Optuna and MLflow")
    for col in ("trial", "what", "fix"):
        table.add_column(col, justify="right" if col == "trial" else "left", overflow="fold")
    for p in problems:
        table.add_row("-" if p.trial is None else str(p.trial), p.what, p.fix + ("" if p.repair else " (not repaired by --repair)"))
    console.print(table)


def check_study(name: str, stores: Stores, repair: bool = False, as_json: bool = False) -> int:
    """Print the study's disagreements (a table, or JSON); with `repair`, fix what can be fixed,
    say what was done and check again. 0: clean (after repairs), 1: disagreements remain."""
    s = read_study(name, stores)
    problems = remaining = find_problems(s)
    done: list[tuple[Problem, str]] = []
    # A repair can change what another check sees (a retry copy changes the parent run's counts):
    # repeat on a fresh read until nothing repairable is left (a few passes at most).
    for _ in range(3 if repair else 0):
        todo = [p for p in remaining if p.repair is not None]
        if not todo:
            break
        for p in todo:
            try:
                done.append((p, p.repair()))
            except Exception as e:  # one repair failing must not stop the others
                done.append((p, f"repair failed: {type(e).__name__}: {e}"))
        s = read_study(name, stores)
        remaining = find_problems(s)
        problems += [p for p in remaining if (p.trial, p.what) not in {(q.trial, q.what) for q in problems}]
    if as_json:
        did = {id(p): what for p, what in done}
        out = [{**p.as_dict(), "repaired": did.get(id(p))} for p in problems]
        print(json.dumps(out, indent=1))
        return 0 if not remaining else 1
    for p, what in done:
        print(f"repaired: {'study' if p.trial is None else f'trial {p.trial}'}: {what}")
    if not remaining:
        runs = sum(1 for r in s.runs.values() if "optuna.trial_number" in r.data.tags)
        print(f"study {name}: {len(s.trials)} trials, {runs} trial runs: Optuna and MLflow agree")
        return 0
    _print_table(remaining, name)
    return 1


def check_cmd(args, stores: Stores) -> int:
    return check_study(args.name, stores, repair=args.repair, as_json=args.json)


def local_artifact_dir(uri: str) -> Path | None:
    """The folder of a file: (or plain path) artifact URI; None for a remote store."""
    if uri.startswith("file:"):
        from mlflow.utils.file_utils import local_file_uri_to_path

        return Path(local_file_uri_to_path(uri))
    if uri.startswith("/"):
        return Path(uri)
    return None
