"""Stores are followed: a study run with `store=S` (or `--store S`) is read back from S by what comes after
it, from any working directory, and nothing reads or writes ./mlruns by surprise.

A user's script from an empty folder: run_study(..., store=S), promote, hpolab.predict(promotion.model_uri,
x) as the Python API page shows it; the hints hpolab prints name the store; read commands without the
store say where they looked and create nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from test_api import last_json, run_script

SPEC = Path(__file__).parent / "own_loop_project" / "studies" / "classic_mnist.yaml"


def _one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.slow
def test_a_promotion_of_a_study_in_another_store_predicts_from_that_store(tmp_path):
    store = tmp_path / "S"
    work = tmp_path / "work"
    work.mkdir()
    out = run_script(f"""
        import json
        import numpy as np
        import hpolab

        study = hpolab.run_study({str(SPEC)!r}, {{"n_trials": 1}}, store={str(store)!r})
        promotion = study.promote()
        x = np.random.default_rng(0).random((5, 1, 8, 8), dtype=np.float32)
        table = hpolab.predict(promotion.model_uri, x)  # as the Python API page shows it: no store= again
        again = promotion.predict(x)
        print(json.dumps([len(table), list(table.columns) == list(again.columns), promotion.model_uri]))
    """, tmp_path, cwd=work)
    rows, same, uri = last_json(out.stdout)
    assert (rows, same, uri) == (5, True, "models:/classic-mnist@champion")
    assert not (work / "mlruns").exists()  # nothing looked in (or made) ./mlruns
    # every hint printed names the store: the study's end line and promote's "load it" line
    text = _one_line(out.stdout)
    assert f"hpolab --store {store} ui" in text and f"hpolab --store {store} study status classic-mnist" in text, out.stdout
    assert f"hpolab --store {store} predict models:/classic-mnist@champion INPUT.npy" in text, out.stdout

    np.save(work / "x.npy", np.zeros((2, 1, 8, 8), np.float32))
    for command in (["predict", "models:/classic-mnist@champion", "x.npy"], ["study", "status", "classic-mnist"]):
        missing = run_cli(*command, cwd=work, check=False)  # no --store: ./mlruns, which nothing ran in
        assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr
        assert f"no {'MLflow tracking store' if command[0] == 'predict' else 'Optuna storage'} at {work / 'mlruns'}" in \
            _one_line(missing.stderr), missing.stderr
        assert "give the --store (or --storage / --tracking-uri) the study ran with" in _one_line(missing.stderr)
        assert not (work / "mlruns").exists()  # a read command creates no store
    other = run_cli("--store", str(store), "predict", "models:/no-such-model@champion", "x.npy", cwd=work, check=False)
    assert other.returncode == 2 and f"in the MLflow store sqlite:///{store / 'mlflow.db'}" in _one_line(other.stderr), other.stderr
