"""An experiment's code as a value: its module file's bytes and their hash, and a module loaded back
from recorded bytes (kept free of pydantic/optuna/mlflow, like experiment.py).

A study records the code it ran (stores/code_artifacts.py writes it on the MLflow runs), so
`hpolab promote NAME` and `hpolab reproduce RUN_ID` work where the experiment is not importable,
and say so when the importable module is not the code that ran.

Limit: only the one module file is hashed and recorded. An experiment that is a package, or that
imports sibling modules of its project, records its entry file alone; its recorded code then needs
those siblings importable (from the project folder, or on PYTHONPATH), and a change in them is not
seen by the hash.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from hpolab.errors import UserError

PACKAGE = "experiments"
HASH_CHARS = 16  # of the sha256 hex digest: as the spec hash (study/driver/spec_guard.py)


@dataclass(frozen=True)
class ExperimentCode:
    """One experiment module's source: `name` as the spec says it, `filename` as recorded (code/<filename>)."""

    name: str
    filename: str
    source: bytes
    hash: str
    path: Path | None = None  # where it was read from (None: recorded code)


def code_hash(source: bytes) -> str:
    return hashlib.sha256(source).hexdigest()[:HASH_CHARS]


def code_filename(name: str) -> str:
    """`digits_cnn` / `experiments.digits_cnn` -> digits_cnn.py; `pkg.mod` -> pkg.mod.py."""
    short = name[len(PACKAGE) + 1:] if name.startswith(PACKAGE + ".") else name
    return f"{short}.py"


def code_of(module: ModuleType, name: str) -> ExperimentCode | None:
    """The code of an imported experiment module (a package: its __init__.py); None without a file."""
    f = getattr(module, "__file__", None)
    if not f or not Path(f).is_file():
        return None
    path = Path(f).resolve()
    source = path.read_bytes()
    return ExperimentCode(name, code_filename(name), source, code_hash(source), path)


def mismatch(name: str, here: ExperimentCode, recorded_hash: str, what: str) -> str:
    """`what` ran code hash A; the module here has hash B (the both-hashes sentence every refusal starts with)."""
    return (f"{what} ran experiment {name!r} with code hash {recorded_hash}; the module here, {here.path}, "
            f"has code hash {here.hash}")


class _RecordedLoader(importlib.abc.InspectLoader):
    """Executes recorded source; get_source lets tracebacks and inspect show its lines."""

    def __init__(self, source: bytes, origin: str):
        self.source, self.origin = source, origin

    def get_source(self, fullname: str) -> str:
        return self.source.decode("utf-8", errors="replace")

    def get_code(self, fullname: str):
        return compile(self.source, self.origin, "exec", dont_inherit=True)

    def is_package(self, fullname: str) -> bool:
        return False


def load_recorded(code: ExperimentCode, where: str) -> ModuleType:
    """The module from recorded bytes, under a private name (it never shadows an importable
    `experiments.<x>`); `where`: what recorded it, for messages (e.g. "run 3f2a..."). UserError when it
    cannot be loaded, naming what is missing and the fix."""
    private = "_hpolab_recorded_" + re.sub(r"\W", "_", code.filename.removesuffix(".py")) + "_" + code.hash
    if private in sys.modules:
        return sys.modules[private]
    # Not "<...>": linecache (tracebacks, inspect) would ignore it; the loader's get_source fills it in.
    loader = _RecordedLoader(code.source, f"recorded:code/{code.filename}#{code.hash}")
    spec = importlib.util.spec_from_loader(private, loader, origin=loader.origin)
    module = importlib.util.module_from_spec(spec)
    sys.modules[private] = module  # before exec: dataclasses and pickling look the module up by name
    try:
        loader.exec_module(module)
    except ImportError as e:
        del sys.modules[private]
        missing = e.name or str(e)
        raise UserError(
            f"experiment {code.name!r}: its recorded code (code/{code.filename} of {where}, hash {code.hash}) imports "
            f"{missing!r}, which is not importable here (only the experiment's own module file is recorded); "
            f"run from the project folder that holds experiments/, or put the project on PYTHONPATH") from None
    except Exception as e:  # noqa: BLE001 -- user code: any failure is reported as one line
        del sys.modules[private]
        raise UserError(f"experiment {code.name!r}: its recorded code (code/{code.filename} of {where}, hash {code.hash}) "
                        f"failed to load: {type(e).__name__}: {e}; run from the project folder to use the code there") from None
    return module
