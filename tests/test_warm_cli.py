"""run_cli's warm interpreter (tests/warm_cli.py) gives what a new `hpolab` process gives."""

from __future__ import annotations

import os
import re

import pytest

from conftest import ROOT, hpolab_env, run_cli

pytestmark = pytest.mark.skipif(os.environ.get("HPOLAB_TEST_FRESH_CLI") == "1",
                                reason="HPOLAB_TEST_FRESH_CLI=1: every command starts a new interpreter, none to compare")


def both(monkeypatch, *args, **kwargs):
    """The same command through the warm interpreter, then in a new interpreter."""
    warm = run_cli(*args, check=False, **kwargs)
    monkeypatch.setenv("HPOLAB_TEST_FRESH_CLI", "1")
    fresh = run_cli(*args, check=False, **kwargs)
    monkeypatch.delenv("HPOLAB_TEST_FRESH_CLI")
    return warm, fresh


def test_env_reports_the_same_interpreter_and_versions(monkeypatch, tmp_path):
    warm, fresh = both(monkeypatch, "env", cwd=tmp_path)
    assert warm.returncode == fresh.returncode == 0, warm.stderr
    timing = re.compile(r"\(\d+(\.\d+)? ms\)")
    assert timing.sub("", warm.stdout) == timing.sub("", fresh.stdout)
    assert "executable" in warm.stdout and warm.stderr == fresh.stderr


def test_bad_input_exits_the_same_with_the_same_message(monkeypatch, store, tmp_path):
    args = ("--store", str(store), "study", "run", str(ROOT / "studies" / "digits_cnn.yaml"), "trainer.lrr=1")
    warm, fresh = both(monkeypatch, *args, cwd=tmp_path)
    assert warm.returncode == fresh.returncode == 2
    assert warm.stderr == fresh.stderr and "lrr" in warm.stderr and "Traceback" not in warm.stderr
    usage_warm, usage_fresh = both(monkeypatch, "study", "nosuch", cwd=tmp_path)  # argparse's own exit
    assert usage_warm.returncode == usage_fresh.returncode == 2 and usage_warm.stderr == usage_fresh.stderr


@pytest.mark.slow
def test_the_commands_environment_and_import_path_are_its_own(monkeypatch, tmp_path):
    """PYTHONPATH puts a project first on the import path, and hpolab's modules are imported under the
    command's environment (several read it at import), not the warm interpreter's; its TMPDIR is where
    its temporary files go."""
    project = tmp_path / "elsewhere"
    (project / "experiments").mkdir(parents=True)
    (project / "experiments" / "__init__.py").write_text("")
    (project / "experiments" / "tiny_probe.py").write_text(
        (ROOT / "experiments" / "diabetes_mlp.py").read_text())
    spec = (ROOT / "studies" / "diabetes_mlp.yaml").read_text()
    spec = re.sub(r"(?m)^experiment:.*$", "experiment: experiments.tiny_probe", spec)
    (tmp_path / "probe.yaml").write_text(spec)
    own_tmp = tmp_path / "own-tmp"
    own_tmp.mkdir()
    env = {**hpolab_env(), "PYTHONPATH": str(project), "HPOLAB_GRACE_PERIOD": "1234", "TMPDIR": str(own_tmp)}
    warm, fresh = both(monkeypatch, "study", "validate", str(tmp_path / "probe.yaml"), cwd=tmp_path, env=env)
    assert warm.returncode == fresh.returncode == 0, warm.stderr
    assert warm.stdout == fresh.stdout
    code = "import tempfile; from hpolab.stores.optuna_storage import GRACE_PERIOD; print(GRACE_PERIOD, tempfile.gettempdir())"
    (project / "experiments" / "tiny_probe.py").write_text(
        (ROOT / "experiments" / "diabetes_mlp.py").read_text() + f"\n{code}\n")
    warm, fresh = both(monkeypatch, "study", "validate", str(tmp_path / "probe.yaml"), cwd=tmp_path, env=env)
    assert warm.returncode == fresh.returncode == 0, warm.stderr
    assert warm.stdout.splitlines()[0] == f"1234 {own_tmp}" and warm.stdout == fresh.stdout


def test_a_command_holds_no_descriptor_a_new_process_would_not(monkeypatch, tmp_path):
    """Nothing of the warm interpreter's (its socket, its pipes) leaks into the command; each command
    is a process of its own."""
    code = "import os; print(os.getpid(), sorted(int(f) for f in os.listdir('/proc/self/fd')))"
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "__init__.py").write_text("")
    (tmp_path / "experiments" / "fds.py").write_text(
        (ROOT / "experiments" / "diabetes_mlp.py").read_text() + f"\n{code}\n")
    spec = re.sub(r"(?m)^experiment:.*$", "experiment: experiments.fds", (ROOT / "studies" / "diabetes_mlp.yaml").read_text())
    (tmp_path / "fds.yaml").write_text(spec)
    args = ("study", "validate", str(tmp_path / "fds.yaml"))
    warm, fresh = both(monkeypatch, *args, cwd=tmp_path)
    again = run_cli(*args, cwd=tmp_path)
    (pid, fds), (_, fresh_fds), (pid_again, _) = (p.stdout.splitlines()[0].split(" ", 1) for p in (warm, fresh, again))
    assert fds == fresh_fds, (fds, fresh_fds)
    assert len({int(pid), int(pid_again), os.getpid()}) == 3
