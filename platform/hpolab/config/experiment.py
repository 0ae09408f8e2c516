"""Finding an experiment module by name (kept free of pydantic/optuna: trial processes import it).

A spec names its experiment (`experiment: digits_cnn`); the module is `experiments/digits_cnn.py` of
the spec's project, i.e. the folder holding `experiments/` at or above the spec's own folder, so
`hpolab study run /elsewhere/project/studies/x.yaml` works from any working directory. Then the
working directory's `experiments/`, then the import path (`pkg.mod` names a module there).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

PACKAGE = "experiments"


class ExperimentNotFound(ModuleNotFoundError):
    """No module of that name where experiments are looked for (a module that exists but whose own
    imports fail raises the plain ModuleNotFoundError/ImportError instead)."""


def find_project_root(start: str | Path) -> Path | None:
    """The folder holding `experiments/` at or above `start` (a folder or a file in it), or None."""
    p = Path(start).resolve()
    if not p.is_dir():
        p = p.parent
    for d in (p, *p.parents):
        if (d / PACKAGE).is_dir():
            return d
    return None


def _has_module(root: Path, short: str) -> bool:
    base = root / PACKAGE / Path(*short.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def project_root_of(module: ModuleType) -> Path | None:
    """The folder holding the `experiments/` a module `experiments.x` was imported from (else None)."""
    f = getattr(module, "__file__", None)
    if not f or not module.__name__.startswith(PACKAGE + "."):
        return None
    path = Path(f).resolve()
    return path.parents[module.__name__.count(".") + (1 if path.name == "__init__.py" else 0)]


def _imported_roots() -> set[Path]:
    """The project roots the imported `experiments` package resolves against (none if not imported)."""
    pkg = sys.modules.get(PACKAGE)
    if pkg is None:
        return set()
    return {Path(p).resolve().parent for p in getattr(pkg, "__path__", [])}


def _bind_package(root: Path) -> None:
    """Make `experiments` (in sys.modules) the package in `root`, bypassing the sys.path search.

    A search could pick another project's: a regular package (with __init__.py) anywhere on sys.path
    wins over a namespace one (without) earlier on it.
    """
    import importlib.machinery
    import importlib.util

    pkg_dir = root / PACKAGE
    init = pkg_dir / "__init__.py"
    if init.is_file():
        spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[str(pkg_dir)])
    else:
        spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
        spec.submodule_search_locations = [str(pkg_dir)]
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    try:
        if spec.loader is not None:
            spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[PACKAGE]
        raise


def put_first_on_path(root: Path) -> None:
    """`root` first on sys.path (moved there if it was already on it)."""
    if str(root) in sys.path:
        sys.path.remove(str(root))
    sys.path.insert(0, str(root))


_IMPORTED_WITH: dict[str, set[str]] = {}  # experiment module -> the top-level modules its first import brought in


def imported_with(module: str) -> set[str]:
    """The top-level module names the first import of `module` in this process brought into sys.modules
    (empty when it was imported before hpolab looked)."""
    return set(_IMPORTED_WITH.get(module, ()))


_IMPORTED_SOURCE: dict[str, bytes | None] = {}  # experiment module -> its file's bytes when imported (or first seen) here


def _import_module(name: str) -> ModuleType:
    """importlib.import_module, noting what a first import brought in (stores/experiment_packages.py).

    A module whose file changed since this process imported it is imported again, as a new module
    object (those handed out before stay as they were): a notebook or script that edits its
    experiment between two studies gets the edited code, which is also what the study records as its
    code (experiment_code.py). Only the module's own file is compared, as the recorded code is."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        now = source_of_file(getattr(loaded, "__file__", None))
        if _IMPORTED_SOURCE.setdefault(name, now) == now:
            return importlib.import_module(name)
        del sys.modules[name]
        forget_bytecode(loaded.__file__)
    before = {n.partition(".")[0] for n in list(sys.modules)}
    module = importlib.import_module(name)
    _IMPORTED_WITH.setdefault(module.__name__, set()).update({n.partition(".")[0] for n in list(sys.modules)} - before)
    _IMPORTED_SOURCE[name] = source_of_file(getattr(module, "__file__", None))
    return module


def source_of_file(path: str | Path | None) -> bytes | None:
    """A module file's bytes as they are now (None: no file, or it is gone)."""
    try:
        return Path(path).read_bytes() if path else None
    except OSError:
        return None


def module_file(root: Path, module: str) -> Path:
    """The file of module `experiments.<x>` in the project `root` (of a package: its __init__.py)."""
    base = root / Path(*module.split("."))
    return base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"


def forget_bytecode(source_file: str | Path) -> None:
    """Remove a changed module's cached bytecode before it is imported again: Python reuses a .pyc
    whose recorded source mtime (whole seconds) and size still match, so an edit within the same
    second that kept the file's size would import the old code."""
    import importlib.util

    try:
        Path(importlib.util.cache_from_source(str(source_file))).unlink()
    except (OSError, ValueError, NotImplementedError):
        pass


def _import_from(root: Path, module: str) -> ModuleType:
    """Import `experiments.<x>` from `root`, even when another root's `experiments` was imported first.

    `experiments` is a top-level package name every project shares: once one project's is in
    sys.modules, `import experiments.x` resolves against it, whatever sys.path says. So a stale
    one (from another root) is dropped from sys.modules before importing; module objects already
    handed out stay valid.
    """
    put_first_on_path(root)  # for the project's own other modules
    if _imported_roots() != {root}:
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]
        importlib.invalidate_caches()
        _bind_package(root)
    return _import_module(module)


def _project_roots(search_from: str | Path | None, looked: list[str]) -> list[tuple[Path, str]]:
    """The project folders load_experiment looks in, in order, each with why (what it did not find
    goes to `looked`)."""
    roots: list[tuple[Path, str]] = []
    if search_from is not None:
        root = find_project_root(search_from)
        if root is not None:
            roots.append((root, "the spec's project"))
        else:
            looked.append(f"no {PACKAGE}/ folder at or above {Path(search_from).resolve()}")
    cwd = Path.cwd().resolve()
    if (cwd / PACKAGE).is_dir() and all(r != cwd for r, _ in roots):
        roots.append((cwd, "the working directory"))
    elif not (cwd / PACKAGE).is_dir():
        looked.append(f"no {PACKAGE}/ folder in the working directory {cwd}")
    return roots


def _short_name(name: str) -> str:
    return name[len(PACKAGE) + 1 :] if name.startswith(PACKAGE + ".") else name


def is_own_loop(module: ModuleType) -> bool:
    """The experiment brings its own training loop: it defines train(config, trial) and no build_model
    (with both, the platform's routine trains it)."""
    return callable(getattr(module, "train", None)) and not hasattr(module, "build_model")


def shape_problems(module: ModuleType, name: str) -> list[str]:
    """What the experiment lacks for the loop that trains it: its own train(config, trial), or the
    names the platform's routine builds its data and model from."""
    if is_own_loop(module):
        return []
    if not hasattr(module, "build_model") and not hasattr(module, "train"):
        return [f"experiment: {name} defines neither train(config, trial) (your own training loop) nor "
                "build_model and load_data (the platform's routine); define one of them (see experiments/README.md)"]
    return [f"experiment: {name} has no {attr} (see experiments/README.md)"
            for attr in ("MODEL_DEFAULTS", "DATA_DEFAULTS", "load_data", "build_model") if not hasattr(module, attr)]


def train_of(module: ModuleType):
    """The experiment's `train(config, trial)`: its own, or the platform's routine over its data, model
    and task (train/builtin.py)."""
    if is_own_loop(module):
        return module.train
    from hpolab.train.builtin import builtin_train

    return builtin_train(module)


def locate_experiment(name: str, search_from: str | Path) -> tuple[Path, str] | None:
    """Where load_experiment(name, search_from) imports the experiment from, found without importing
    anything: (project root, module name), or None when it is not a file of a project's
    experiments/ folder (the import path is searched by importing)."""
    short = _short_name(name)
    for root, _ in _project_roots(search_from, []):
        if _has_module(root, short):
            return root, f"{PACKAGE}.{short}"
    return None


def load_experiment(name: str, search_from: str | Path | None = None) -> ModuleType:
    """`digits_cnn` -> `experiments.digits_cnn` of the project; `pkg.mod` -> that import path.

    Looks, in order: the project at or above `search_from` (the spec's folder), the working
    directory, the import path. Without `search_from` (a trial process, a command given a study
    name), a module already imported under that name is the one: the process that loaded the spec
    found it, and a forked child inherits it.
    """
    short = _short_name(name)
    module = f"{PACKAGE}.{short}"
    if search_from is None:
        for m in (module, name):
            if m in sys.modules and getattr(sys.modules[m], "__file__", None):
                return sys.modules[m]

    looked: list[str] = []
    for root, why in _project_roots(search_from, looked):
        if _has_module(root, short):
            return _import_from(root, module)
        looked.append(f"{root / PACKAGE / short.replace('.', '/')}.py ({why})")

    # The import path: a dotted name of the user's own package, or an installed `experiments`.
    candidates = [name, module] if "." in name and name != module else [module] + ([name] if name != module else [])
    last: Exception | None = None
    for mod in candidates:
        try:
            return _import_module(mod)
        except ModuleNotFoundError as e:
            if e.name and not (mod == e.name or mod.startswith(e.name + ".")):
                raise  # the module exists but one of its own imports is missing
            last = e
    looked.append(f"{' / '.join(candidates)} on the import path")
    raise ExperimentNotFound(f"experiment {name!r} not found (looked at: {'; '.join(looked)})") from last
