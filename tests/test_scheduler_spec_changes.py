"""What a trial scheduler's spec may and may not say, through the real CLI: a change of trial_scheduler
while trials are paused (only the recorded scheduler resumes them) and PBT mutations that cannot work
are refused in one line that names the field and the fix."""

from __future__ import annotations

import pytest

from conftest import open_study, run_cli
from kill_harness import FAULT_PROJECT, KINDS, run_driver


@pytest.mark.slow
def test_dropping_the_trial_scheduler_while_trials_are_paused_is_refused(store, tmp_path):
    killed = run_driver(store, "asha", "strand", ("pause", "after", "2"), tmp_path)  # trials 0 and 1 paused at rung 0
    assert killed.killed_at, killed.output
    _, _, args, _ = KINDS["asha"]
    plain = [a for a in args if not a.startswith("trial_scheduler=")]
    out = run_cli("--store", str(store), "study", "run", "studies/faulty.yaml", "name=strand", *plain, "--allow-spec-change",
                  cwd=FAULT_PROJECT, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "trial_scheduler changed while 2 trials are paused (trial 0, 1)" in out.stderr and "--new-study strand-2" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    _, study = open_study(store, "strand")
    assert len(study.get_trials()) == 2  # nothing was written: the recorded spec still runs them
    again = run_driver(store, "asha", "strand", None, tmp_path)
    assert again.returncode == 0, again.output


PBT_REFUSED = [
    ("trial_scheduler.mutations={model.channels: {choices: [8, 16, 32]}}",
     "trial_scheduler.mutations.model.channels: changes the model's tensor shapes (channels=8:"),
    ("trial_scheduler.mutations={trainer.lr: {range: [-1, 0]}}", "trial_scheduler.mutations.trainer.lr: lr=-1.0: lr must be > 0"),
    ("trial_scheduler.mutations={trainer.lr: {factor: [-1, 2]}}", "trial_scheduler.mutations.trainer.lr.factor: [-1.0, 2.0]: factors must be > 0"),
    ("trial_scheduler.interval_epochs=6", "trial_scheduler.interval_epochs: 6 leaves no boundary before trainer.max_epochs (6)"),
    ("trial_scheduler.mutations={trainer.lr: {factor: [0.8]}}",
     "trial_scheduler.mutations: trainer.lr.factor: give two numbers [a, b], e.g. {factor: [0.8, 1.25]} (got [0.8])"),
    ("trial_scheduler.mutations={trainer.lr: {bogus: 1}}", "trial_scheduler.mutations: trainer.lr: give one of {factor: [a, b]}"),
    ("trial_scheduler.population=abc", "trial_scheduler.population: Input should be a valid integer"),
]


@pytest.mark.parametrize("override, says", PBT_REFUSED, ids=[o.split("=")[0] + str(i) for i, (o, _) in enumerate(PBT_REFUSED)])
def test_pbt_specs_that_cannot_work_are_refused_at_validate_in_one_line(store, override, says):
    out = run_cli("--store", str(store), "study", "validate", "studies/digits_pbt.yaml", override, check=False)
    assert out.returncode == 2, (override, out.stdout)
    problems = [line for line in out.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and problems[0].startswith(f"  - {says}"), out.stderr  # one line, this field, no pydantic class
    assert "Traceback" not in out.stderr and "Factor" not in out.stderr and "n_trials" not in out.stderr


def test_a_pbt_mutation_that_keeps_shapes_and_bounds_is_accepted(store):
    out = run_cli("--store", str(store), "study", "validate", "studies/digits_pbt.yaml",
                  "trial_scheduler.mutations={model.dropout: {range: [0.0, 0.5]}, trainer.lr: {factor: [0.8, 1.25]}}")
    assert "valid" in out.stdout
