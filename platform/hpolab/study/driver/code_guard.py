"""A study remembers the experiment code it runs, and refuses other code unless told.

Recorded when the study is created (or by `hpolab launch`, on the submit host, before any worker
starts): Optuna study user attrs `hpolab.code_hash` (config/experiment_code.py), `hpolab.code_file`
and `hpolab.project_dir` (where the experiment was imported from); on the MLflow parent run the
module as the artifact `code/<module>.py` with tags `hpolab.code_hash` / `hpolab.code_file`
(stores/code_artifacts.py). Every trial run records the code it ran the same way (tracker.py).

A driver or worker whose importable module hashes differently is refused (exit 2) with both hashes:
sync the code, or `--allow-code-change` (recorded as `code/<module>-<hash>.py` on the parent run;
the study's hash becomes the new one), or `--new-study NAME`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import optuna

from hpolab.config.experiment_code import ExperimentCode, mismatch
from hpolab.errors import UserError
from hpolab.stores.code_artifacts import TAG_HASH, log_code

ATTR_HASH = "hpolab.code_hash"
ATTR_FILE = "hpolab.code_file"
ATTR_PROJECT = "hpolab.project_dir"


@dataclass(frozen=True)
class CodeChange:
    """Code to record on the study: the first (`previous` None) or an accepted change."""

    code: ExperimentCode
    previous: str | None


def check_code(study: optuna.Study, code: ExperimentCode | None, allow_change: bool) -> CodeChange | None:
    """None when the study recorded this code (or there is no file to hash); else what to record, or
    UserError (nothing written) when the study ran other code and `allow_change` is off."""
    if code is None:
        return None
    recorded = study.user_attrs.get(ATTR_HASH)
    if recorded == code.hash:
        return None
    if recorded is None:
        return CodeChange(code, None)
    if not allow_change:
        raise UserError(refusal(study, code, recorded))
    return CodeChange(code, recorded)


def refusal(study: optuna.Study, code: ExperimentCode, recorded: str) -> str:
    where = study.user_attrs.get(ATTR_PROJECT)
    return (mismatch(code.name, code, recorded, f"study {study.study_name!r}") + ".\n"
            f"  Sync the code with the study's (its {study.user_attrs.get(ATTR_FILE, 'code/' + code.filename)} on the "
            f"study's MLflow parent run{f', as launched from {where}' if where else ''}),\n"
            "  or pass --allow-code-change to continue the study with this code (each trial run records the code it ran),\n"
            f"  or run it as a new study: --new-study {study.study_name}-2")


def record_on_study(study: optuna.Study, code: ExperimentCode) -> None:
    """The Optuna side: hash, file and project (what `hpolab launch` records before any worker runs)."""
    study.set_user_attr(ATTR_HASH, code.hash)
    study.set_user_attr(ATTR_FILE, f"code/{code.filename}")
    if code.path is not None:
        study.set_user_attr(ATTR_PROJECT, str(_project_of(code.path)))


def record_at_launch(study: optuna.Study, code: ExperimentCode | None) -> None:
    """`hpolab launch`, on the submit host: refuse (UserError) when the study ran other code, else
    record this code on the study, so a worker with a different module refuses to run."""
    if check_code(study, code, allow_change=False) is not None:
        record_on_study(study, code)


def record_code(study: optuna.Study, client, parent_run_id: str, code: ExperimentCode | None,
                change: CodeChange | None, note: Callable[[str], None]) -> None:
    """Record the first code or an accepted change: Optuna attrs + the module on the parent run
    (also when only `hpolab launch` recorded it so far: its parent run did not exist then)."""
    if change is None:
        if code is not None and not client.get_run(parent_run_id).data.tags.get(TAG_HASH):
            log_code(client, parent_run_id, code)
        return
    code = change.code
    first = change.previous is None
    # The first code is code/<module>.py; an accepted change is code/<module>-<hash>.py beside it.
    filename = code.filename if first else f"{code.filename.removesuffix('.py')}-{code.hash}.py"
    artifact = log_code(client, parent_run_id, code, filename)
    record_on_study(study, code)
    study.set_user_attr(ATTR_FILE, artifact)
    if not first:
        note(f"experiment code change accepted (--allow-code-change): {change.previous} -> {code.hash}, "
             f"recorded as {artifact} on the parent run")


def _project_of(path: Path) -> Path:
    """The folder holding `experiments/` for experiments/<x>.py (else the module's own folder)."""
    for d in path.parents:
        if d.name == "experiments":
            return d.parent
    return path.parent
