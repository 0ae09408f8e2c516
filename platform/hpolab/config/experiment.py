"""Finding an experiment module by name (kept free of pydantic/optuna: trial processes import it)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType


def load_experiment(name: str) -> ModuleType:
    """`digits_cnn` -> experiments.digits_cnn; `pkg.mod` -> that import path."""
    candidates = [f"experiments.{name}", name] if "." not in name else [name, f"experiments.{name}"]
    # Experiments live next to the spec's project root; the working directory is that root.
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    last: Exception | None = None
    for mod in candidates:
        try:
            return importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name and not (mod == e.name or mod.startswith(e.name + ".")):
                raise  # the module exists but one of its own imports is missing
            last = e
    raise ModuleNotFoundError(f"experiment {name!r} not found (looked for {', '.join(candidates)})") from last
