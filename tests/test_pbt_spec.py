"""A PBT spec as the user writes it: n_trials comes from the population (a different one is refused in
one line), and mutations that cannot change during training are refused."""

from __future__ import annotations

from pathlib import Path

from conftest import ROOT, run_cli

SPEC = ROOT / "studies" / "digits_pbt.yaml"


def test_n_trials_is_the_population():
    out = run_cli("study", "validate", str(SPEC))
    assert "n_trials: 4" in out.stdout


def test_a_different_n_trials_is_refused_naming_both_fields():
    out = run_cli("study", "validate", str(SPEC), "n_trials=10", check=False)
    assert out.returncode == 2, out.stderr
    problems = [line for line in out.stderr.splitlines() if line.strip().startswith("- ")]  # (the spec loader's list)
    assert len(problems) == 1 and "n_trials: 10" in problems[0] and "trial_scheduler.population (4)" in problems[0], out.stderr
    assert "Traceback" not in out.stderr


def test_a_mutation_of_the_optimizer_is_refused(tmp_path: Path):
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC.read_text().replace("  mutations:\n", "  mutations:\n    trainer.optimizer: {choices: [adam, sgd]}\n"))
    out = run_cli("study", "validate", str(spec), check=False)
    assert out.returncode == 2 and "trial_scheduler.mutations.trainer.optimizer" in out.stderr, out.stderr
