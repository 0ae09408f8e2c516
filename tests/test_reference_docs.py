"""docs/reference/*.md are generated from the code (scripts/gen-reference): they must equal what the
generator writes today, and name every spec field, every CLI option and every MLflow name hpolab writes."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import reference_docs  # noqa: E402
import reference_env  # noqa: E402
import reference_mlflow  # noqa: E402

REFERENCE = ROOT / "docs" / "reference"


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    reference_docs.generate(out)
    return out


@pytest.mark.parametrize("page", sorted(reference_docs.PAGES))
def test_committed_page_is_what_the_generator_writes(generated, page):
    assert (REFERENCE / page).read_text() == (generated / page).read_text(), (
        f"docs/reference/{page} is out of date with the code: run scripts/gen-reference and commit it")


def _spec_paths(cls, prefix=""):
    for name, attr, ann, *_ in reference_docs._fields(cls):
        yield prefix + name
        _, _, models = reference_docs._type_of(ann)
        for m in models:
            yield from _spec_paths(m, prefix + name + ".")


def test_every_spec_field_has_a_row_with_a_meaning():
    from hpolab.config.spec import StudySpec
    from hpolab.train.config import TrainConfig

    page = (REFERENCE / "spec.md").read_text()
    cells = [re.split(r"(?<!\\)\|", line) for line in page.splitlines() if line.startswith("| `")]
    rows = {c[1].strip().strip("`"): c[4].strip() for c in cells}
    # the schema's own top-level and trainer fields, not the generator's walk of them
    for name in StudySpec.model_fields:
        key = StudySpec.model_fields[name].alias or name
        assert rows.get(key), f"spec field {key} has no row with a meaning in docs/reference/spec.md"
    for name in TrainConfig.__dataclass_fields__:
        assert rows.get(f"trainer.{name}"), f"trainer.{name} has no row in docs/reference/spec.md"
    for path in _spec_paths(StudySpec):
        leaf = path.split(".")[-1]
        assert any(r.endswith(leaf) for r in rows), path


def test_every_cli_command_and_option_is_on_the_page():
    from hpolab.cli import build_parser

    page = (REFERENCE / "cli.md").read_text()
    sections = {s.split("`", 2)[1]: s for s in page.split("\n## ")[1:] if s.startswith("`")}

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    cmd = f"{path} {name}"
                    assert cmd in sections, f"`{cmd}` has no section in docs/reference/cli.md"
                    for a in sub._actions:
                        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) or a.default is argparse.SUPPRESS:
                            continue
                        for word in a.option_strings or [a.metavar or a.dest]:
                            assert reference_docs._code(word) in sections[cmd], f"{cmd} {word} is not on the page"
                    walk(sub, cmd)

    walk(build_parser(), "hpolab")


def test_every_mlflow_name_written_is_in_the_table_and_none_other():
    written = reference_mlflow.written_names()
    missing = sorted(set(written) - set(reference_mlflow.NAMES))
    assert not missing, f"written by hpolab but not in scripts/reference_mlflow.py NAMES: {missing} (written in {[sorted(written[m]) for m in missing]})"
    stale = sorted(set(reference_mlflow.NAMES) - set(written))
    assert not stale, f"in scripts/reference_mlflow.py NAMES but no longer written by hpolab: {stale}"
    page = (REFERENCE / "mlflow.md").read_text()
    for shown, _, _ in reference_mlflow.NAMES.values():
        assert f"`{shown}`" in page


def test_every_exit_code_is_on_the_page():
    import hpolab.errors as errors

    page = (REFERENCE / "exit-codes.md").read_text()
    for name, value in vars(errors).items():
        if name.startswith("EXIT_"):
            assert f"| {value} | `{name}` |" in page


def test_spec_page_has_a_section_per_part_and_a_table_of_contents():
    from hpolab.config.spec import StudySpec

    page = (REFERENCE / "spec.md").read_text()
    sections = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    assert sections == list(reference_docs.SECTIONS)
    for title in sections:
        assert f"](#{reference_docs._anchor(title)})" in page, f"the table of contents has no link to {title}"
    top = {(f.alias or name) for name, f in StudySpec.model_fields.items()}
    assert sorted(top) == sorted(k for keys in reference_docs.SECTIONS.values() for k in keys)


def test_every_environment_variable_the_code_uses_is_on_the_page_and_none_other():
    """scripts/reference_env.py finds the variables in the source; the page lists exactly those. The
    finder itself is checked on variables read in each way it knows (a literal, a module constant, a
    comprehension over a tuple, an f-string, a dict's keys)."""
    uses = reference_env.env_uses()
    missing = sorted(set(uses) - set(reference_env.ENV))
    assert not missing, f"used by hpolab but not in scripts/reference_env.py ENV: {missing}"
    stale = sorted(set(reference_env.ENV) - set(uses))
    assert not stale, f"in scripts/reference_env.py ENV but no longer used by hpolab: {stale}"
    for name, how in [("HPOLAB_STORE", "a literal"), ("HPOLAB_HOST_SLOTS_DIR", "a module constant"),
                      ("MLFLOW_TRACKING_PASSWORD", "an f-string over a tuple"), ("MLFLOW_WORKSPACE", "a loop over a constant tuple"),
                      ("SLURM_ARRAY_TASK_ID", "a dict's keys"), ("HPOLAB_METRICS_FLUSH_S", "a read with a default")]:
        assert uses[name].reads, f"{name} ({how}) was not found as read"
    assert uses["HPOLAB_METRICS_FLUSH_S"].defaults == ["2.0"]  # (its default is a module constant, resolved)
    page = (REFERENCE / "environment.md").read_text()
    shown = re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", page, re.M)
    assert sorted(shown) == sorted(uses), "docs/reference/environment.md lists other variables than the code uses"


def test_the_environment_finder_sees_a_new_variable(tmp_path, monkeypatch):
    """The check above can fail: a module that reads one more variable is found, and the table lacks it."""
    pkg = tmp_path / "hpolab"
    pkg.mkdir()
    (pkg / "x.py").write_text('import os\nNAME = "HPOLAB_NEW_KNOB"\nv = os.environ.get(NAME, "3")\n')
    monkeypatch.setattr(reference_env, "PACKAGE", pkg)
    uses = reference_env.env_uses()
    assert set(uses) == {"HPOLAB_NEW_KNOB"} and uses["HPOLAB_NEW_KNOB"].defaults == ["3"]
    assert "HPOLAB_NEW_KNOB" not in reference_env.ENV


def test_architecture_lists_every_module_as_the_generator_writes_it():
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert reference_docs.architecture_with_modules(page) == page, (
        "docs/architecture.md's module list is out of date with the package: run scripts/gen-reference and commit it")
    listed = set(re.findall(r"^\| `([\w/]+\.py)` \|", page, re.M))
    files = {p.relative_to(reference_docs.PACKAGE).as_posix() for p in reference_docs.PACKAGE.rglob("*.py")}
    assert listed == files, f"not listed: {sorted(files - listed)}; listed but gone: {sorted(listed - files)}"
    assert "## Module paths" not in page and "| Before | After |" not in page  # (moves are git's history)
