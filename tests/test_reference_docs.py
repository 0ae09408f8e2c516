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
    rows = {c[1].strip().strip("`"): c[5].strip() for c in cells}
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
                            assert f"`{word}`".replace("|", "\\|") in sections[cmd], f"{cmd} {word} is not on the page"
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
