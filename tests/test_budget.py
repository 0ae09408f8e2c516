"""Exact budgets: any number of workers on one study finish exactly n_trials, never one more.

Four real `hpolab worker` processes start together on the embedded SQLite store; each counts and asks
under the study's budget lock. Repeated: a second round raises the budget and they start together again.
After each round `hpolab study check` finds the two stores in agreement.
(PostgreSQL's advisory-lock path runs in tests/test_distributed.py.)
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from conftest import ROOT, run_cli, start_cli


def _workers(store: Path, n_trials: int, n: int = 4) -> list[str]:
    args = ["studies/digits_cnn.yaml", "name=budget", f"n_trials={n_trials}", "parallel=1", "trainer.max_epochs=1",
            "pruner={type: none}", "sampler={type: random}", "log_models=none"]
    procs = [start_cli("--store", str(store), "worker", *args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True) for _ in range(n)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * n, outs
    return outs


@pytest.mark.slow
def test_four_workers_never_overshoot_the_budget(store):
    for budget in (3, 6):
        _workers(store, budget)
        trials = optuna.load_study(study_name="budget", storage=f"sqlite:///{store / 'optuna.db'}").get_trials()
        assert [t.state for t in trials].count(TrialState.COMPLETE) == budget, [t.state for t in trials]
        assert len(trials) == budget
        check = run_cli("--store", str(store), "study", "check", "budget", cwd=ROOT, timeout=300, check=False)
        assert check.returncode == 0, check.stdout + check.stderr  # both stores agree after four workers
