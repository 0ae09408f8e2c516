"""`hpolab doctor`: the checks pass on a working experiment and catch the usual breakages."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli

FAULT_PROJECT = Path(__file__).parent / "fault_project"


@pytest.mark.slow
def test_doctor_passes_on_the_digits_study():
    out = run_cli("doctor", "studies/digits_cnn.yaml")
    assert "overfits a tiny batch" in out.stdout and "all checks passed" in out.stdout


@pytest.mark.slow
def test_doctor_fails_when_the_lr_cannot_learn():
    out = run_cli("doctor", "studies/digits_cnn.yaml", "trainer.lr=1e-8", check=False)
    assert out.returncode == 1
    assert "FAIL training: overfits a tiny batch" in " ".join(out.stdout.split())
    assert "hpolab lr-find" in out.stdout


def test_doctor_finds_unregistered_layers():
    out = run_cli("doctor", "studies/listbug.yaml", cwd=FAULT_PROJECT, check=False)
    text = " ".join(out.stdout.split())
    assert out.returncode == 1
    assert "FAIL model: parameters registered" in text and "NOT registered: layers" in text
