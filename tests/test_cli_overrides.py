"""`key=value` overrides may come before or after a command's options (`hpolab study run SPEC --store DIR
n_trials=3`), for every command that takes them, through the real CLI. Each command is run the cheap
way that still shows the override was read: `study validate` and `launch slurm --dry-run` print it,
`launch k8s` writes it into the Job, and the commands that would train are given an override that the
spec check refuses (so the refusal names it, instead of argparse's `unrecognized arguments`)."""

from __future__ import annotations

import pytest

from conftest import ROOT, run_cli

SPEC = "studies/diabetes_mlp.yaml"


def _orders(options: list[str], overrides: list[str]) -> list[list[str]]:
    """The options before the overrides, after them, and between two of them."""
    return [[*options, *overrides], [*overrides, *options], [overrides[0], *options, *overrides[1:]]]


def test_validate_takes_overrides_on_either_side_of_the_options(store):
    for args in _orders(["--store", str(store)], ["n_trials=7", "trainer.lr=0.005"]):
        out = run_cli("study", "validate", SPEC, *args)
        assert "n_trials: 7" in out.stdout and "lr: 0.005" in out.stdout, (args, out.stdout)
    out = run_cli("--store", str(store), "study", "validate", SPEC, "--store", str(store), "n_trials=7")  # global option both sides
    assert "n_trials: 7" in out.stdout


@pytest.mark.parametrize("command", [["study", "run"], ["worker"], ["doctor"], ["lr-find"]])
def test_training_commands_read_overrides_after_their_options(store, tmp_path, command):
    options = {"lr-find": ["--store", str(store), "--out", str(tmp_path / "lr")],
               "study": ["--store", str(store), "--allow-spec-change"], "worker": ["--store", str(store), "--allow-code-change"],
               "doctor": ["--store", str(store)]}[command[0]]
    for args in _orders(options, ["n_trials=3", "trainer.lrr=1"])[:2]:  # (the spec check reads them all: two orders suffice)
        out = run_cli(*command, SPEC, *args, check=False)
        assert out.returncode == 2 and "trainer.lrr: unknown key" in out.stderr, (args, out.stderr)
        assert "unrecognized" not in out.stderr and "Traceback" not in out.stderr


def test_launch_commands_read_overrides_after_their_options(store, tmp_path):
    slurm = ["--workers", "2", "--single-node", "--store", str(store), "--dry-run"]
    for args in _orders(slurm, ["n_trials=4", "trainer.lr=0.005"]):
        out = run_cli("launch", "slurm", str(ROOT / SPEC), *args, cwd=tmp_path)
        assert f"worker {ROOT / SPEC} n_trials=4 trainer.lr=0.005" in out.stdout.strip().splitlines()[-1], (args, out.stdout)
    for i, args in enumerate(_orders(["--workers", "2", "--image", "hpolab:dev", "--out", str(tmp_path / "k8s")],
                                     ["n_trials=4", "trainer.lr=0.005"])):
        (tmp_path / "k8s").mkdir(exist_ok=True)
        for old in (tmp_path / "k8s").iterdir():
            old.unlink()
        run_cli("launch", "k8s", SPEC, *args)
        job = (tmp_path / "k8s" / "job.yaml").read_text()
        assert "n_trials=4" in job and "trainer.lr=0.005" in job, (args, job)


def test_an_unknown_option_is_still_refused(store):
    out = run_cli("study", "validate", SPEC, "n_trials=3", "--bogus", check=False)
    assert out.returncode == 2 and "unrecognized arguments: --bogus" in out.stderr
    out = run_cli("study", "status", "x", "n_trials=3", check=False)  # status takes no overrides
    assert out.returncode == 2 and "unrecognized arguments: n_trials=3" in out.stderr
