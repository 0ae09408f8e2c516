"""The README and the getting-started page stay true: every command of their ```bash blocks runs, in
page order, through the real CLI in a fresh folder, and exits as the page says (0, unless the line's
comment says `exit N`).

The fresh folder holds what a clone has beside the commands: `studies/`, `experiments/` and an empty
store `./mlruns` (migrated databases copied in, as a first run would make them), so the commands run as
written, with no `--store`. To keep the test cheap its `studies/digits_cnn.yaml` is the shipped one with
`n_trials: 3` and `trainer.max_epochs: 2`, and each `n_trials=N` on a command line that raises the budget
becomes one more trial than the last (the page's 30 then 36 become 4 then 5). `scripts/...` lines (they
install) are only checked to exist; `hpolab ui` is stopped with Ctrl-C once it is ready, and must exit 0.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, run_cli, start_cli

README = ROOT / "README.md"


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


def page_commands(page: Path) -> list[tuple[str, int]]:
    """Every command line of the page's ```bash blocks, in order, with the exit code its comment says
    (`exit N`, on its line or on the comment lines right above it; else 0)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
        above = ""
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("#"):
                above += line
            elif line.strip():
                said = re.search(r"#.*\bexit (\d+)", above + line)
                out.append((" ".join(line.split()), int(said.group(1)) if said else 0))
                above = ""
    return out


def _fresh_folder(tmp_path: Path, store: Path) -> Path:
    work = tmp_path / "work"
    (work / "studies").mkdir(parents=True)
    spec = yaml.safe_load((ROOT / "studies" / "digits_cnn.yaml").read_text())
    assert spec["n_trials"] == 24, "the pages speak of the demo's 24 trials: update them and the test together"
    spec["n_trials"], spec["trainer"]["max_epochs"] = 3, 2
    (work / "studies" / "digits_cnn.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (work / "experiments").symlink_to(ROOT / "experiments")
    shutil.copytree(store, work / "mlruns")
    return work


def _ui_until_ready_then_ctrl_c(args: list[str], work: Path) -> tuple[int, str]:
    proc = start_cli(*args, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if "MLflow UI ready" in line:
            proc.send_signal(signal.SIGINT)
            break
    else:
        proc.kill()
    rest, _ = proc.communicate(timeout=60)
    return proc.returncode, "".join(seen) + (rest or "")


@pytest.mark.slow
@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_pages_command_blocks_run_in_a_fresh_folder(tmp_path, store, page):
    work = _fresh_folder(tmp_path, store)
    budget, ran = 3, []
    for line, expected in page_commands(ROOT / page):
        argv = shlex.split(line, comments=True)
        if argv[0].startswith("scripts/"):
            assert (ROOT / argv[0]).is_file() and (ROOT / argv[0]).stat().st_mode & 0o111, f"{page}: {argv[0]} is not an executable script"
            continue
        assert argv[0] in (".venv/bin/hpolab", ".venv/bin/python"), f"{page} runs something else: {line}"
        for i, word in enumerate(argv):
            if re.fullmatch(r"n_trials=\d+", word):
                budget += 1
                argv[i] = f"n_trials={budget}"
        if argv[0] == ".venv/bin/python":
            proc = subprocess.run([sys.executable, *argv[1:]], cwd=work, capture_output=True, text=True, timeout=120)
            code, output = proc.returncode, proc.stdout + proc.stderr
        elif argv[1] == "ui":
            code, output = _ui_until_ready_then_ctrl_c(argv[1:], work)
        else:
            proc = run_cli(*argv[1:], cwd=work, check=False)
            code, output = proc.returncode, proc.stdout + proc.stderr
        assert code == expected, f"{page}: `{line}` exited {code}, the page says {expected}:\n{output[-3000:]}"
        assert "Traceback" not in output, f"{page}: `{line}`:\n{output[-3000:]}"
        ran.append((argv, output))
    assert ran, f"{page} has no command to run"
    if page == "README.md":
        assert "prob_" in ran[-1][1], "the tour's last command (predict) printed no probabilities"
        assert (work / "mlruns" / "reports" / "digits-cnn.html").is_file()
    else:
        refused = next(out for argv, out in ran if "trainer.max_epochs=20" in argv and "--new-study" not in argv)
        assert "exists with another spec" in refused and "--new-study" in refused and "--allow-spec-change" in refused, refused


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
        # the first cells of a table headed "| command |" (getting-started's "every command at a glance")
        for table in re.findall(r"^\| command \|.*?\n((?:\|.*\n)+)", page.read_text(), re.M):
            found += [(str(page.relative_to(ROOT)), cell) for cell in re.findall(r"^\| `(hpolab [^`]+)` \|", table, re.M)]
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
