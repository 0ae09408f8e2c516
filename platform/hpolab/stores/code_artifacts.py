"""The experiment's code on MLflow runs: written as `code/<module>.py` + tags, read back, and the
module a command uses for a run (the importable one, else the recorded one).

Tags: `hpolab.code_hash` (config/experiment_code.py: sha256 of the module file, 16 hex digits) and
`hpolab.code_file` (the artifact path). The study's parent run and every trial run carry them.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from hpolab.config.experiment_code import ExperimentCode, code_filename, code_hash, code_of, load_recorded
from hpolab.errors import UserError
from hpolab.stores import mlflow_runs as tr

TAG_HASH = "hpolab.code_hash"
TAG_FILE = "hpolab.code_file"
FOLDER = "code"


def code_tags(code: ExperimentCode, artifact: str | None = None) -> dict[str, str]:
    return {TAG_HASH: code.hash, TAG_FILE: artifact or f"{FOLDER}/{code.filename}"}


def log_code(client, run_id: str, code: ExperimentCode, filename: str | None = None) -> str:
    """`code/<filename>` (default: the module's) on the run, and its tags; returns the artifact path."""
    artifact = upload_code(client, run_id, code, filename)
    tr.set_tags(client, run_id, code_tags(code, artifact))
    return artifact


def upload_code(client, run_id: str, code: ExperimentCode, filename: str | None = None) -> str:
    """`code/<filename>` on the run, without its tags (a trial run gets them when it is created); the artifact path."""
    name = filename or code.filename
    with tempfile.TemporaryDirectory(prefix="hpolab-code-") as tmp:
        p = Path(tmp) / name
        p.write_bytes(code.source)
        client.log_artifact(run_id, str(p), FOLDER)
    return f"{FOLDER}/{name}"


def read_code(client, run, name: str) -> ExperimentCode | None:
    """The code a run recorded (None when it records none: runs made before hpolab recorded code).
    UserError when it says it has code that cannot be read or does not match its hash."""
    tags = run.data.tags
    digest = tags.get(TAG_HASH)
    if not digest:
        return None
    artifact = tags.get(TAG_FILE) or f"{FOLDER}/{code_filename(name)}"
    run_id = run.info.run_id
    with tempfile.TemporaryDirectory(prefix="hpolab-code-") as tmp:
        try:
            source = Path(client.download_artifacts(run_id, artifact, tmp)).read_bytes()
        except Exception as e:  # noqa: BLE001 -- a missing or unreachable artifact: one line, with the fix
            raise UserError(f"run {run_id} records experiment {name!r} code {artifact} (hash {digest}), but it cannot be read "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); is --store/--tracking-uri the "
                            "store the study used? Or run from the project folder that holds the experiment") from None
    if code_hash(source) != digest:
        raise UserError(f"run {run_id}: its recorded {artifact} has hash {code_hash(source)}, not the {digest} its tag says "
                        "(the artifact was changed); run from the project folder to use the code there")
    return ExperimentCode(name, Path(artifact).name, source, digest)


@dataclass(frozen=True)
class RunExperiment:
    """The module a command uses for a run, and where it came from."""

    module: ModuleType
    here: ExperimentCode | None  # the importable module's code (None: the recorded code is used)
    recorded_hash: str | None  # what the run ran (None: it records no code)
    recorded_by: str  # the run that recorded it, for messages

    @property
    def differs(self) -> bool:
        return self.here is not None and self.recorded_hash is not None and self.here.hash != self.recorded_hash


def experiment_for_runs(client, runs: list, name: str) -> RunExperiment:
    """The experiment `name` for the first of `runs` that records code (a trial's run, then its study's
    parent run): the importable module when there is one, else the recorded code."""
    from hpolab.config.experiment import ExperimentNotFound, load_experiment

    recorder = next((r for r in runs if r is not None and r.data.tags.get(TAG_HASH)), None)
    by = f"run {recorder.info.run_id}" if recorder is not None else f"run {runs[0].info.run_id}"
    try:
        module = load_experiment(name)
    except ExperimentNotFound as e:
        if recorder is None:
            raise UserError(f"{e.args[0]}; and {by} records no experiment code (it ran before hpolab recorded it): "
                            "run from the project folder that holds experiments/, or put the project on PYTHONPATH") from None
        code = read_code(client, recorder, name)
        return RunExperiment(load_recorded(code, by), None, code.hash, by)
    except Exception as e:  # noqa: BLE001 -- the module exists here but fails to import: the user's to fix
        raise UserError(f"experiment {name!r}: importing it failed: {type(e).__name__}: {e}") from None
    recorded = recorder.data.tags[TAG_HASH] if recorder is not None else None
    return RunExperiment(module, code_of(module, name), recorded, by)
