"""`hpolab reproduce RUN_ID`: a trial retrained from its MLflow run gives identical metrics."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli


@pytest.mark.slow
def test_a_trial_reproduces_exactly(store):
    run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", "n_trials=2", "trainer.max_epochs=2",
            "pruner={type: none}", "log_models=none")
    rows = json.loads(run_cli("--store", str(store), "compare", "digits-cnn", "--format", "json").stdout)
    for row in rows:
        out = run_cli("--store", str(store), "reproduce", row["run_id"])
        assert "reproduced: identical" in out.stdout, out.stdout


def test_reproduce_unknown_run_is_a_clear_error(store):
    out = run_cli("--store", str(store), "reproduce", "0" * 32, check=False)
    assert out.returncode == 2 and "no run" in out.stderr and "Traceback" not in out.stderr
