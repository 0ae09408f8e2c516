"""Small commands through the real CLI: env, status of an unknown study, help."""

from __future__ import annotations

import torch

from conftest import run_cli


def test_env_reports_versions_and_runs_a_matmul():
    out = run_cli("env")
    assert torch.__version__.split("+")[0] in out.stdout
    assert "matmul 512x512 on cpu: ok" in out.stdout or "matmul 512x512 on cuda: ok" in out.stdout
    assert "optuna" in out.stdout and "mlflow" in out.stdout


def test_status_of_an_unknown_study_is_one_clear_error(store):
    out = run_cli("--store", str(store), "study", "status", "no-such-study", check=False)
    assert out.returncode == 2
    assert "no study named 'no-such-study'" in out.stderr and "Traceback" not in out.stderr


def test_status_without_a_store_says_how_to_fix(tmp_path):
    out = run_cli("--store", str(tmp_path / "empty"), "study", "status", "digits-cnn", check=False)
    assert out.returncode == 2
    assert "run a study first" in out.stderr
    assert not (tmp_path / "empty").exists()  # asking does not create a store


def test_study_run_prints_no_optuna_info_lines(store):
    """Optuna logs `A new study created in RDB with name: ...` at INFO to stderr; the study's own first
    line is what a user should see first. (Optuna's warnings still show: its level is WARNING.)"""
    from conftest import FAULT_PROJECT, FAULT_SPEC

    out = run_cli("--store", str(store), "study", "run", FAULT_SPEC, "n_trials=1", "trainer.max_epochs=1", "log_models=none",
                  cwd=FAULT_PROJECT)
    both = out.stdout + out.stderr
    assert "A new study created" not in both and "[I " not in both, both
    assert "study faulty" in out.stdout.splitlines()[0], out.stdout
