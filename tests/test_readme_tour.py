"""The README's five-minute tour stays true: its commands, run in order through the real CLI on a fresh
store, each exit 0.

The tour is the fenced bash block under "## A five-minute tour". To keep the test cheap, the
`study run` line gets `n_trials=3 trainer.max_epochs=2` appended (the tour itself shows the default
study); every other line runs as written, with `--store` added to each hpolab command.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli

README = ROOT / "README.md"
CHEAP = ["n_trials=3", "trainer.max_epochs=2"]  # appended to the tour's `study run` only


def tour_commands(page: Path = README, heading: str = "## A five-minute tour") -> list[list[str]]:
    """The tour's command lines, split as a shell would (comments dropped)."""
    text = page.read_text()
    section = text.split("\n" + heading, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md: the five-minute tour has no ```bash block"
    return [shlex.split(line, comments=True) for line in block.group(1).splitlines() if line.strip()]


def test_readme_is_short_its_tour_parses_and_its_links_exist():
    from hpolab.cli import build_parser

    assert len(README.read_text().splitlines()) <= 150, "README.md is over 150 lines: move details into docs/"
    commands = tour_commands()
    hpolab = [argv for argv in commands if argv[0] == ".venv/bin/hpolab"]
    assert [argv[1:3] for argv in hpolab][:2] == [["study", "run"], ["study", "status"]]
    assert {argv[1] for argv in hpolab} >= {"study", "compare", "report", "promote", "predict"}
    for argv in commands:
        assert argv[0] in (".venv/bin/hpolab", ".venv/bin/python"), f"the tour runs only hpolab and Python: {argv}"
    parser = build_parser()
    for argv in hpolab:
        parser.parse_args(argv[1:])  # a misspelled command or option exits 2 here
    # The getting-started page shows the same tour (and `hpolab ui`, which serves until stopped): the slow
    # test below, which runs the README's, runs its commands too.
    guide = tour_commands(ROOT / "docs" / "getting-started.md", "## The five-minute tour")
    assert [argv for argv in guide if argv[:2] != [".venv/bin/hpolab", "ui"]] == commands
    for target in re.findall(r"\]\(([^)#]+)\)", README.read_text()):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README.md links {target}, which does not exist"


@pytest.mark.slow
def test_the_tour_runs_on_a_fresh_store(tmp_path, store):
    work = tmp_path / "work"  # the tour's working directory: inputs.npy is written here
    work.mkdir()
    (work / "studies").symlink_to(ROOT / "studies")
    for argv in tour_commands():
        if argv[0] == ".venv/bin/python":
            proc = subprocess.run([sys.executable, *argv[1:]], cwd=work, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr}"
            continue
        args = argv[1:] + (CHEAP if argv[1:3] == ["study", "run"] else [])
        proc = run_cli(*args, "--store", str(store), cwd=work)  # raises with the output unless it exits 0
    assert "prob_" in proc.stdout, "the tour's last command (predict) printed no probabilities"
    assert (store / "reports" / "digits-cnn.html").is_file()


def _documented_hpolab_lines() -> list[tuple[str, str]]:
    """Every hpolab command line in a ```bash block of README.md and docs/ (the page, the line)."""
    found = []
    for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            text = block.replace("\\\n", " ")  # a command continued over several lines is one line
            for line in text.splitlines():
                words = line.strip()
                if re.match(r"(\.venv/bin/)?hpolab\s", words):
                    found.append((str(page.relative_to(ROOT)), words))
    return found


def test_every_documented_hpolab_command_parses():
    """Each command line the README and the docs show is one the CLI accepts (commands, options, their
    values' form): a renamed option or a misspelled command fails here, not in a reader's shell."""
    from hpolab.cli import parse_args

    lines = _documented_hpolab_lines()
    assert len(lines) > 30, "found too few documented commands: the block pattern no longer matches the docs"
    bad = []
    for page, line in lines:
        try:
            argv = shlex.split(re.sub(r"\[(-[^]]*)\]", r"\1", line), comments=True)  # a synopsis' [--option] counts
        except ValueError as e:
            bad.append(f"{page}: {line} ({e})")
            continue
        try:
            parse_args(argv[1:])
        except SystemExit as e:
            if e.code != 0:
                bad.append(f"{page}: {line}")
    assert not bad, "documented commands the CLI refuses:\n" + "\n".join(bad)
