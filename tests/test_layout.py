"""The package layout stays a one-way data flow: no import cycles among hpolab modules, errors.py at
the bottom, train/ free of optuna/mlflow/pydantic, and platform/ never a package.

Imports are read with `ast`, including imports inside functions (a lazy import is still a
dependency: it only hides a cycle until the function runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "platform"
PKG = ROOT / "hpolab"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """hpolab modules that `path` imports (a `from pkg import name` of a submodule counts as that submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            if n in modules and n != me:
                found.add(n)
    return found


def import_graph() -> dict[str, set[str]]:
    files = sorted(PKG.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    # The check above must be able to fail: a made-up graph with a cycle is reported.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_errors_is_the_bottom():
    assert import_graph()["hpolab.errors"] == set()


def test_imports_point_down_the_data_flow():
    """Layers, bottom first; a module may import its own layer or lower ones only."""
    layers = ["errors", "train", "config", "stores", "study", "registry", "analysis", "launch", "tools", "cli"]
    rank = {name: i for i, name in enumerate(layers)}

    def layer(m: str) -> int | None:
        parts = m.split(".")
        return rank.get(parts[1]) if len(parts) > 1 else None

    upward = [
        f"{m} -> {n}"
        for m, deps in import_graph().items()
        for n in deps
        if layer(m) is not None and layer(n) is not None and layer(n) > layer(m)
    ]
    assert upward == []


def test_train_imports_no_tracking_or_config_libraries():
    banned = ("optuna", "mlflow", "pydantic")
    offenders = []
    for f in (PKG / "train").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{f.name}: {n}" for n in names if n.split(".")[0] in banned]
    assert offenders == []


def test_platform_is_a_source_root_not_a_package():
    assert not (ROOT / "__init__.py").exists()


MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def size_offenders(root: Path = ROOT) -> list[str]:
    """Modules under `root` longer than MAX_MODULE_LINES and functions/methods (nested ones too)
    longer than MAX_FUNCTION_LINES (end_lineno - lineno + 1, decorators not counted). Classes are not
    limited: their methods are."""
    offenders = []
    for f in sorted(root.rglob("*.py")):
        source = f.read_text()
        where = f.relative_to(root)
        n = len(source.splitlines())
        if n > MAX_MODULE_LINES:
            offenders.append(f"{where}: {n} lines (module limit {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(source, filename=str(f))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    offenders.append(f"{where}:{node.lineno} {node.name}(): {length} lines (function limit {MAX_FUNCTION_LINES})")
    return offenders


def test_modules_and_functions_stay_small():
    """No module under platform/ over 400 lines, no function or method over 60: split by idea instead."""
    offenders = size_offenders()
    assert offenders == [], "too long:\n" + "\n".join(offenders)


def test_the_size_check_names_offenders(tmp_path):
    # The check above must be able to fail: a made-up tree with a long module and a long method.
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    (tmp_path / "big.py").write_text(f"class A:\n    def long(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n" + "y = 1\n" * 400)
    (tmp_path / "ok.py").write_text("def short():\n    return 1\n")
    assert size_offenders(tmp_path) == [
        "big.py: 463 lines (module limit 400)",
        "big.py:2 long(): 62 lines (function limit 60)",
    ]


# What reading a study may import (issue 21: torch costs seconds, MLflow seconds more). Not a timing:
# which libraries a module pulls in at import time.
LIGHT_MODULES = {
    "hpolab.cli": ("torch", "mlflow", "optuna", "pandas"),
    "hpolab.config.spec": ("torch", "mlflow"),  # `study validate`, a spec named where a study is
    "hpolab.analysis.status": ("torch", "mlflow", "pandas"),  # `study status`, `study list`
    "hpolab.stores.studies": ("torch", "mlflow", "pandas"),
}


def test_read_paths_do_not_import_heavy_libraries():
    import subprocess
    import sys

    code = ("import importlib, json, sys; mods = json.loads(sys.argv[1]); out = {}\n"
            "for m, banned in mods.items():\n"
            "    importlib.import_module(m); out[m] = [b for b in banned if b in sys.modules]\n"
            "print(json.dumps(out))")
    import json

    out = subprocess.run([sys.executable, "-c", code, json.dumps(LIGHT_MODULES)], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, check=True).stdout
    assert json.loads(out) == {m: [] for m in LIGHT_MODULES}
