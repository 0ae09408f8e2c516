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
    # integrations: adapters of other frameworks' callbacks to a trial (they see only the trial object);
    # api: the Python functions users call (run_study, load_study, ...), which the CLI is a layer over.
    layers = ["errors", "train", "integrations", "config", "stores", "study", "registry", "analysis", "launch", "tools", "api", "cli"]
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


def test_integrations_import_no_tracking_library():
    # The framework callbacks see only the trial object passed in: Optuna and MLflow stay the platform's.
    offenders = []
    for f in (PKG / "integrations").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{f.name}: {n}" for n in names if n.split(".")[0] in ("optuna", "mlflow")]
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


# What reading a study may import (torch costs seconds, MLflow seconds more). Not a timing:
# which libraries a module pulls in at import time.
LIGHT_MODULES = {
    "hpolab": ("torch", "mlflow", "optuna", "pandas"),  # `import hpolab` in a notebook; its API names import lazily
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


# study/ and analysis/ are split into sub-packages by idea. Each says in its __init__ docstring what it
# owns and what it may import; the __init__ holds nothing else (no re-exports, no import-time work).
SPLIT_PACKAGES = ("study", "analysis")
MAX_STUDY_ENTRIES = 10
# study's sub-packages, bottom first: each may import its own or earlier ones, never later ones.
STUDY_ORDER = ["state", "objectives", "sampling", "retention", "trials", "lr_test", "driver"]
# analysis: report may use compare; nothing else in analysis imports either.
ANALYSIS_ALLOWED = {("report", "compare")}


def init_offenders(root: Path = PKG, packages=SPLIT_PACKAGES) -> list[str]:
    """Sub-packages (folders with .py files) of `packages` under `root` without an __init__.py, or
    whose __init__ is not a docstring alone."""
    offenders = []
    for top in packages:
        for folder in sorted(p for p in (root / top).iterdir() if p.is_dir() and any(p.glob("*.py"))):
            where = folder.relative_to(root)
            init = folder / "__init__.py"
            if not init.exists():
                offenders.append(f"{where}: no __init__.py")
                continue
            body = ast.parse(init.read_text()).body
            if not body or not ast.get_docstring(ast.Module(body=body, type_ignores=[])):
                offenders.append(f"{where}/__init__.py: no docstring")
            elif len(body) > 1:
                offenders.append(f"{where}/__init__.py: more than a docstring")
    return offenders


def test_split_packages_have_a_docstring_init_and_nothing_else():
    offenders = init_offenders()
    assert offenders == [], "\n".join(offenders)


def test_the_init_check_names_offenders(tmp_path):
    # The check above must be able to fail: a sub-package without __init__, one without docstring, one re-exporting.
    for name, init in [("bare", None), ("mute", "x = 1\n"), ("busy", '"""Owns x."""\nfrom os import path\n'),
                       ("good", '"""Owns y; imports nothing."""\n')]:
        (tmp_path / "study" / name).mkdir(parents=True)
        (tmp_path / "study" / name / "m.py").write_text("")
        if init is not None:
            (tmp_path / "study" / name / "__init__.py").write_text(init)
    assert init_offenders(tmp_path, ("study",)) == [
        "study/bare: no __init__.py", "study/busy/__init__.py: more than a docstring", "study/mute/__init__.py: no docstring"]


def top_entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "__pycache__")


def test_study_has_few_top_level_entries():
    entries = top_entries(PKG / "study")
    assert len(entries) <= MAX_STUDY_ENTRIES, f"study/ has {len(entries)} entries: {entries}"


def test_the_entry_count_sees_files_and_folders(tmp_path):
    # The check above must be able to fail: files and folders count, __pycache__ does not.
    for name in ("__pycache__", "driver", "trials"):
        (tmp_path / name).mkdir()
    for name in ("__init__.py", "flat.py"):
        (tmp_path / name).write_text("")
    assert top_entries(tmp_path) == ["__init__.py", "driver", "flat.py", "trials"]


def sub_package_offenders(graph: dict[str, set[str]]) -> list[str]:
    """Imports between study's sub-packages that point up STUDY_ORDER, and imports of analysis.compare
    or analysis.report from elsewhere in analysis (report -> compare allowed)."""
    rank = {name: i for i, name in enumerate(STUDY_ORDER)}

    def part(m: str) -> tuple[str, str] | None:
        parts = m.split(".")
        return (parts[1], parts[2]) if len(parts) > 3 else (parts[1], "") if len(parts) > 2 else None

    offenders = []
    for m, deps in graph.items():
        for n in deps:
            a, b = part(m), part(n)
            if not a or not b or a[0] != b[0] or a[1] == b[1]:
                continue
            if a[0] == "study" and rank.get(b[1], -1) > rank.get(a[1], len(STUDY_ORDER)):
                offenders.append(f"{m} -> {n}")
            if a[0] == "analysis" and b[1] in ("compare", "report") and (a[1], b[1]) not in ANALYSIS_ALLOWED:
                offenders.append(f"{m} -> {n}")
    return sorted(offenders)


def test_sub_packages_import_down_their_order():
    offenders = sub_package_offenders(import_graph())
    assert offenders == [], "\n".join(offenders)


def test_the_sub_package_check_names_offenders():
    # The check above must be able to fail: made-up imports up the study order and into report.
    graph = {"hpolab.study.objectives.ranking": {"hpolab.study.driver.driver", "hpolab.study.state.budget"},
             "hpolab.study.driver.driver": {"hpolab.study.trials.runner"},
             "hpolab.analysis.compare.command": {"hpolab.analysis.report.data"},
             "hpolab.analysis.status": {"hpolab.analysis.compare.study"},
             "hpolab.analysis.report.command": {"hpolab.analysis.compare.study"}}
    assert sub_package_offenders(graph) == [
        "hpolab.analysis.compare.command -> hpolab.analysis.report.data",
        "hpolab.analysis.status -> hpolab.analysis.compare.study",
        "hpolab.study.objectives.ranking -> hpolab.study.driver.driver"]


# The trial lifecycle: a trial's hpolab state is read in one place (stores/trial_states.py) and moved in
# one place (study/state/lifecycle.py). Every other module asks them: none reads the paused mark or
# tells "RUNNING but paused / claimed / released" itself.
LIFECYCLE_MODULES = {"hpolab/stores/trial_states.py", "hpolab/study/state/lifecycle.py"}
LIFECYCLE_MARKS = [
    (r"[\"']hpolab\.(paused|released|imported_from|retry_due)[\"']", "names a state mark"),
    (r"(?<![.\w\"'])PAUSED(_ATTR)?\b(?![\"'])", "uses the paused mark"),
    (r"system_attrs(\.get\(|\[)\s*(RELEASED|IMPORTED|RETRY_DUE)\b", "reads a state mark"),
    (r"(TrialState\.RUNNING|[\"']RUNNING[\"'])\W.*\b(paused|owner|mlflow_run_id|RUN_ID)\b", "tells a RUNNING trial's state itself"),
]
ALLOWED_MARK_LINES = {
    # the SQL readers fetch the marks the lifecycle reads (they import them from it)
    ("hpolab/stores/optuna_sql.py", "_MARKS = "),
    ("hpolab/stores/optuna_sql.py", "from hpolab.stores.trial_states import"),
}


def lifecycle_offenders(root: Path = PKG) -> list[str]:
    import re

    offenders = []
    for f in sorted(root.rglob("*.py")):
        where = str(f.relative_to(root.parent))
        if where in LIFECYCLE_MODULES:
            continue
        code = [line.split("#", 1)[0] for line in f.read_text().splitlines()]  # (comments may talk about them)
        in_doc = False
        for n, line in enumerate(code, 1):
            if line.count('"""') % 2:
                in_doc = not in_doc
                continue
            if in_doc or any(where == w and line.lstrip().startswith(start) for w, start in ALLOWED_MARK_LINES):
                continue
            offenders += [f"{where}:{n}: {why}: {line.strip()}" for pattern, why in LIFECYCLE_MARKS if re.search(pattern, line)]
    return offenders


def test_only_the_lifecycle_reads_and_writes_a_trials_state_marks():
    offenders = lifecycle_offenders()
    assert offenders == [], "ask stores/trial_states.py or study/state/lifecycle.py instead:\n" + "\n".join(offenders)


def test_the_lifecycle_check_names_offenders(tmp_path):
    # The check above must be able to fail: a made-up package with each kind of offence.
    pkg = tmp_path / "hpolab"
    (pkg / "stores").mkdir(parents=True)
    (pkg / "stores" / "trial_states.py").write_text('PAUSED = "hpolab.paused"\n')
    (pkg / "bad.py").write_text('"""Docs may say hpolab.paused."""\n'
                                'x = t.system_attrs.get("hpolab.paused")\n'
                                'y = t.state == TrialState.RUNNING and t.user_attrs.get("mlflow_run_id")\n'
                                'z = t.system_attrs.get(RELEASED)  # released\n')
    assert [o.split(": ", 1)[0] for o in lifecycle_offenders(pkg)] == ["hpolab/bad.py:2", "hpolab/bad.py:3", "hpolab/bad.py:4"]
