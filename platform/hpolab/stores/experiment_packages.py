"""The versions of the packages an experiment imports, as `env.<distribution>` tags of its runs.

The environment capture (environment.py) names the platform's own stack (torch, numpy, optuna,
mlflow); an experiment brings its own: Lightning, transformers and the accelerate its Trainer needs,
scikit-learn. Counted: the top-level packages the experiment module imports (its import statements)
and those its first import in this process brought in, as installed distributions; of the ones it
brought in, only the top-level distributions (none of the distributions loaded here requires them):
`transformers` and `accelerate`, not the tokenizers and hub client transformers itself requires.
`hpolab reproduce` compares them with the versions installed where it runs.

Which distribution owns which top-level module (`importlib.metadata.packages_distributions()`) is
read from every installed distribution's file list: 1.6-1.7 s on this machine's environment (torch
and its CUDA libraries list tens of thousands of files), paid by every driver's start. It depends
only on what is installed, so it is kept in the cache folder (db_templates.cache_dir) under a key
made of the distributions' metadata folders on sys.path (names and modification times: an install,
an upgrade or an uninstall changes them) and read from there by the next driver (milliseconds).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sys
from importlib import metadata
from types import ModuleType

# top-level module names a module's first import brought into sys.modules (config/experiment.py records them)
from hpolab.config.experiment import imported_with

_SPLIT = re.compile(r"[\s;<>=!~\[(]")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def direct_imports(module: ModuleType) -> set[str]:
    """The top-level names of the module's absolute import statements (anywhere in its file)."""
    path = getattr(module, "__file__", None)
    try:
        tree = ast.parse(open(path, encoding="utf-8").read()) if path else None
    except (OSError, SyntaxError, ValueError):
        tree = None
    names: set[str] = set()
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _requirements(dist: str) -> set[str]:
    try:
        required = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return set()
    return {_norm(_SPLIT.split(r, maxsplit=1)[0]) for r in required if "extra ==" not in r.replace('"', "").replace("'", "")}


def _installed_key() -> str:
    """A digest of the distributions' metadata folders on sys.path: their names and modification times."""
    seen = []
    for entry in sys.path:
        try:
            with os.scandir(entry or ".") as found:
                seen += [f"{entry}/{e.name}:{e.stat().st_mtime_ns}" for e in found if e.name.endswith((".dist-info", ".egg-info"))]
        except OSError:  # (a zip file, a folder that is gone)
            continue
    return hashlib.sha256("\n".join(seen).encode()).hexdigest()[:20]


def package_owners() -> dict[str, list[str]]:
    """metadata.packages_distributions(), from the cache while what is installed is unchanged (the module docstring)."""
    from hpolab.stores.db_templates import cache_dir

    path = cache_dir() / f"packages-{_installed_key()}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    owners = {name: list(dists) for name, dists in metadata.packages_distributions().items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(owners))
        os.replace(tmp, path)  # whole or not at all: a concurrent driver writes the same content
    except OSError:
        pass  # an unwritable cache: the next driver reads the distributions again
    return owners


def experiment_packages(module: ModuleType, skip: set[str] = frozenset()) -> dict[str, str]:
    """{"env.<distribution>": version} for the experiment's packages (the module docstring says which);
    `skip`: distributions already recorded (normalized names)."""
    owners = package_owners()
    dists_of = lambda names: {d for n in names for d in owners.get(n, ())}  # noqa: E731
    direct = dists_of(direct_imports(module))
    brought = dists_of(imported_with(module.__name__))
    loaded = dists_of({name.partition(".")[0] for name in list(sys.modules)})
    required = set().union(*(_requirements(d) for d in loaded | direct | brought))
    keep = direct | {d for d in brought if _norm(d) not in required}
    out = {}
    for dist in sorted(keep, key=_norm):
        name = _norm(dist)
        if name in skip or name == "hpolab":
            continue
        try:
            out[f"env.{name}"] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out
