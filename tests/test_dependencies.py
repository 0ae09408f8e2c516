"""What hpolab imports at a module's top is installed by `pip install hpolab` (its base dependencies):
a package that the test extras or a developer's .venv happen to bring would pass every test here and
fail `scripts/demo` on a fresh machine."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "platform" / "hpolab"
# the framework adapters: their module is imported only by users of that framework's extra
OPTIONAL = {PACKAGE / "integrations"}


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:  # (a module's top only: imports inside functions are lazy, an extra's or the stdlib's)
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _declared() -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}


def test_every_package_a_module_imports_at_its_top_is_a_base_dependency():
    dists = packages_distributions()
    declared = _declared()
    missing = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(parent in OPTIONAL for parent in path.parents):
            continue
        for name in _top_level_imports(path):
            if name in sys.stdlib_module_names or name in ("hpolab", "__future__"):
                continue
            found = {d.lower().replace("_", "-") for d in dists.get(name, [])}
            if not found & declared:
                missing.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    assert not missing, f"imported at a module's top but not in pyproject.toml's dependencies: {missing}"
