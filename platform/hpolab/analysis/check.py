"""`hpolab study check NAME`: do the study's two stores tell the same story?

Optuna's state is the truth; MLflow records it. Read in bulk (the study's trials once, one paged
search over the experiment's runs, one over its logged models, a stat per uploaded checkpoint), so
a study of hundreds of trials is checked in seconds. Every disagreement is a `Problem` (trial,
what, fix); those with a `repair` are fixed by `--repair` without deleting anything (consistency.py).

What is checked:
- each started trial has its MLflow run (user attr `mlflow_run_id`), not deleted, tagged with its
  trial number, under the study's parent run;
- the states agree: a finished trial's run has `hpolab.state` = Optuna's state and the matching
  status (COMPLETE: FINISHED, PRUNED: KILLED, FAIL: FAILED, with a `hpolab.fail_reason`); an
  interrupted attempt (Ctrl-C, SIGTERM, a dead driver) is queued to resume (a retry copy), up to the
  study's max_interrupts per configuration;
- a retry's run names the attempt it continues (`hpolab.retry_of_trial`, `hpolab.retry_of_run`);
- no RUNNING trial without a live owner (owners.py; heartbeats for another host's);
- no trial run (stores/run_roles.py: not a promote run) claims a trial that does not point at it;
- the parent run (study user attr `mlflow_parent_run_id`) is closed when no worker runs, with the
  study's counts; no more finished trials than `n_trials`;
- uploaded checkpoints (`hpolab.checkpoint_epoch`) and logged models (`hpolab.model_id`) exist,
  unless retention deleted them (no run tag names a deleted model unmarked); a COMPLETE trial has a
  model or says why not;
- a kept trial model is named `<study>-trial-<n>`, tagged with its trial, state and study, carries
  its run's params and has its objective values linked as metrics (model_checks.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hpolab.analysis.check_read import Study, read_study
from hpolab.analysis.consistency import Problem, orphan_runs, parent_problems, running_problems, trial_problems
from hpolab.analysis.model_checks import model_problems
from hpolab.stores.paths import Stores
from hpolab.stores.run_roles import is_trial_run


def find_problems(s: Study) -> list[Problem]:
    if not s.trials:
        return []
    if s.experiment_id is None:
        return [Problem(None, f"no MLflow experiment named {s.name!r}, but {len(s.trials)} Optuna trials",
                        "point --tracking-uri at the study's MLflow store")]
    out = running_problems(s)
    for t in s.trials:
        out += trial_problems(s, t)
        run = s.runs.get(t.user_attrs.get("mlflow_run_id") or "")
        if run is not None and run.info.lifecycle_stage != "deleted":
            out += model_problems(s, t, run)
    out += orphan_runs(s)
    out += parent_problems(s)
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


@dataclass
class CheckResult:
    """What `study check` found: every problem seen, those that remain, and the repairs done."""

    study: Study  # the last read of the study
    problems: list[Problem]  # every disagreement seen (before and after repairs)
    remaining: list[Problem]  # those still there (empty: the stores agree)
    done: list[tuple[Problem, str]] = field(default_factory=list)  # (problem, what its repair did)


def run_check(name: str, stores: Stores, repair: bool = False) -> CheckResult:
    """The study's disagreements; with `repair`, fix what can be fixed and check again."""
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
    return CheckResult(s, problems, remaining, done)


def outcome_lines(r: CheckResult) -> list[str]:
    """What the check did and found that is not a disagreement: its repairs, and trials left claimed
    by a driver that is gone (a stop signal during the claim), which the next run starts in place.
    Printed by `study check` and by the API's Study.check."""
    lines = [f"repaired: {'study' if p.trial is None else f'trial {p.trial}'}: {what}" for p, what in r.done]
    for number, reason in sorted(r.study.left_claimed.items()):
        lines.append(f"trial {number}: claimed, then {reason} before it was started; "
                     "the next `study run` starts it in the same trial (nothing of it was trained or logged)")
    return lines


def check_study(name: str, stores: Stores, repair: bool = False, as_json: bool = False) -> int:
    """Print the study's disagreements (a table, or JSON); with `repair`, fix what can be fixed,
    say what was done and check again. 0: clean (after repairs), 1: disagreements remain."""
    r = run_check(name, stores, repair)
    s, problems, remaining, done = r.study, r.problems, r.remaining, r.done
    if as_json:
        did = {id(p): what for p, what in done}
        out = [{**p.as_dict(), "repaired": did.get(id(p))} for p in problems]
        print(json.dumps(out, indent=1))
        return 0 if not remaining else 1
    for line in outcome_lines(r):
        print(line)
    if not remaining:
        runs = sum(1 for r in s.runs.values() if is_trial_run(r.data.tags, s.name))
        print(f"study {name}: {len(s.trials)} trials, {runs} trial runs: Optuna and MLflow agree")
        return 0
    _print_table(remaining, name)
    return 1


def check_cmd(args, stores: Stores) -> int:
    return check_study(args.name, stores, repair=args.repair, as_json=args.json)
