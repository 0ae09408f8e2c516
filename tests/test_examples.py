"""examples/: the own-loop script and notebook run as a user runs them, on a temporary store.

The script runs as `python examples/own_loop.py key=value ...`; the notebook is executed by nbclient in
the project's Python 3 kernel (ipykernel, installed by `scripts/setup test`: its kernel spec lives in
the virtual environment, and jupyter_client starts it with this interpreter) with its parameters cell
set to the store and small overrides. Both are checked on what they leave behind: the study's trials,
the registered model's alias, the predictions.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, hpolab_env, run_cli

EXAMPLES = ROOT / "examples"
NOTEBOOK = EXAMPLES / "own_loop.ipynb"
STUDY = "digits-own-loop"
SMALL = {"n_trials": 6, "trainer.max_epochs": 3, "promotion.race_seeds": 3}  # (promote races the top 3 on 3 fresh seeds)


def _registered(store: Path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}").get_model_version_by_alias(STUDY, "champion")


def _raced_winner(mv, trials: list[dict]) -> None:
    """promote raced the top 3 trials (as compare ranks them) on fresh seeds: the version is the winner's."""
    assert mv.tags["hpolab.race_winner"] == f"trial {mv.tags['hpolab.trial_number']}"
    assert int(mv.tags["hpolab.trial_number"]) in [t["trial"] for t in trials[:3]]
    assert mv.tags["hpolab.race_seeds"] == "1,2,3"  # the winner ran every seed


def _trials(store: Path) -> list[dict]:
    return json.loads(run_cli("--store", str(store), "compare", STUDY, "--format", "json").stdout)


def test_the_notebook_is_stored_without_outputs_and_has_a_parameters_cell():
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert ["parameters"] == [t for c in code for t in c.metadata.get("tags", [])]
    assert nb.metadata.kernelspec.name == "python3"
    # the script's steps, in the same order
    steps = ["run_study(", "trials_df(", "promote(", "predict("]
    text = "\n".join(c.source for c in code)
    script = (EXAMPLES / "own_loop.py").read_text()
    assert [text.index(s) for s in steps] == sorted(text.index(s) for s in steps)
    assert [script.index(s) for s in steps] == sorted(script.index(s) for s in steps)


@pytest.mark.slow
def test_the_script_runs_a_study_promotes_and_predicts(store):
    env = {**hpolab_env(), "HPOLAB_STORE": str(store)}
    out = subprocess.run([sys.executable, "examples/own_loop.py", *(f"{k}={v}" for k, v in SMALL.items())],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    trials = _trials(store)
    assert len(trials) == SMALL["n_trials"] and {t["state"] for t in trials} <= {"COMPLETE", "PRUNED"}
    assert all(t["epochs"] <= SMALL["trainer.max_epochs"] for t in trials)
    mv = _registered(store)
    _raced_winner(mv, trials)
    printed = re.search(r"predicted (\[[\d, ]+\]), true (\[[\d, ]+\])", out.stdout)
    assert printed and len(json.loads(printed.group(1))) == 5, out.stdout
    # the printed table: one line per trial under its header
    assert sum(1 for line in out.stdout.splitlines() if re.match(r"^\s+\d+\s+(COMPLETE|PRUNED)\s", line)) == SMALL["n_trials"]


@pytest.mark.slow
def test_the_notebook_runs_in_a_kernel_with_a_progress_bar(store, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    params.source = f'SPEC = "../studies/digits_own_loop.yaml"\nSTORE = {str(store)!r}\nOVERRIDES = {SMALL!r}'
    NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(EXAMPLES)}}).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    n = SMALL["n_trials"]
    bars = [o for o in outputs if "text/html" in o.get("data", {}) and "<progress" in o.data["text/html"]]
    study_bars = [b for b in bars if f"{STUDY}.race-" not in b.data["text/html"]]  # (promote's race has its own)
    assert len(study_bars) == 1 and f"<progress value={n} max={n}" in study_bars[0].data["text/html"]  # updated in place to the end
    trials = _trials(store)
    assert len(trials) == n
    table = next(c for c in nb.cells if "trials_df()" in c.source).outputs[0]
    assert table.output_type == "execute_result" and len(re.findall(r"<tr>\s*<th>\d+</th>", table.data["text/html"])) == n
    mv = _registered(store)
    _raced_winner(mv, trials)
    shown = next(c for c in nb.cells if c.source.startswith("predicted")).outputs[0].text
    predicted = json.loads(re.search(r"predicted (\[[\d, ]+\])", shown).group(1))
    assert len(predicted) == 5
    assert not os.environ.get("MLFLOW_TRACKING_URI")
