"""One counting rule (stores/trial_counts.py) for the budget, the progress line, `study list` and
`study status`: a retried attempt (an interrupted one, resumed by its copy), a warm start's imported
trial and a released one are not results. Fabricated trials read by the real CLI, then a study
interrupted by SIGTERM and resumed, and one with warm-start imports."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from conftest import FAULT_PROJECT, FAULT_SPEC, run_cli, start_cli, wait_for_checkpoints
from hpolab.study.state.budget import epochs_used, may_start_another, trial_counts

DIST = {"x": FloatDistribution(0, 1)}


def _add(study, state, value=None, attrs=None):
    study.add_trial(create_trial(state=state, value=value, params={"x": 0.5}, distributions=DIST, system_attrs=attrs))


def _list_row(store: Path, name: str, cwd: Path) -> dict[str, str]:
    out = run_cli("--store", str(store), "study", "list", cwd=cwd).stdout
    cells = next(line for line in out.splitlines() if line.startswith(f"│ {name} ")).split("│")[1:-1]
    return dict(zip(("study", "direction", "metric", "complete", "pruned", "fail", "running", "paused", "best", "last"), map(str.strip, cells)))


def _status_summary(store: Path, name: str, cwd: Path, *extra: str) -> str:
    out = run_cli("--store", str(store), "study", "status", name, *extra, cwd=cwd).stdout
    return next(line for line in out.splitlines() if "; best:" in line)


def test_list_status_and_budget_count_by_one_rule(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name="counted", direction="maximize")
    _add(study, TrialState.FAIL)  # 0: interrupted, resumed as 3
    _add(study, TrialState.FAIL)  # 1: interrupted, resumed as 4
    _add(study, TrialState.COMPLETE, 0.5)
    _add(study, TrialState.COMPLETE, 0.7, {"retry_history": [0], "failed_trial": 0})
    _add(study, TrialState.COMPLETE, 0.6, {"retry_history": [1], "failed_trial": 1})
    _add(study, TrialState.COMPLETE, 0.99, {"hpolab.imported_from": "older trial 3"})  # a warm start's
    _add(study, TrialState.FAIL, None, {"hpolab.released": True})  # given back unrun
    _add(study, TrialState.FAIL)  # a failure of its own
    counts = trial_counts(study)
    assert (counts["complete"], counts["fail"], counts["finished"], counts["retried"]) == (3, 1, 4, 2)
    row = _list_row(store, "counted", tmp_path)
    assert (row["complete"], row["pruned"], row["fail"], row["running"], row["best"]) == ("3", "0", "1", "0", "0.7")
    assert _status_summary(store, "counted", tmp_path) == \
        "3 complete, 1 fail (2 attempts retried, 1 imported by a warm start, 1 released unrun: not counted); best: trial 3 value 0.7"


def test_a_paused_trial_counts_as_paused_not_running_and_still_fills_the_budget(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name="paused", direction="maximize")
    _add(study, TrialState.COMPLETE, 0.8)
    for attrs in ({"hpolab.paused": {"rung": 0, "epoch": 1}}, {"hpolab.paused": None}):  # paused; resumed (training)
        t = study.ask()
        for k, v in attrs.items():
            study._storage.set_trial_system_attr(t._trial_id, k, v)
    counts = trial_counts(study)
    assert (counts["running"], counts["paused"]) == (1, 1)
    assert not may_start_another(counts, 3)  # a paused trial is a configuration of the budget
    row = _list_row(store, "paused", tmp_path)
    assert (row["running"], row["paused"], row["best"]) == ("1", "1", "0.8")
    assert _status_summary(store, "paused", tmp_path).startswith("1 complete, 1 paused, 1 running; best:")


def test_status_caps_the_running_and_waiting_trials_of_a_large_study(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name="busy", direction="minimize")
    for i in range(30):
        _add(study, TrialState.COMPLETE, float(i))
    for _ in range(40):
        study.ask()  # RUNNING (30..69)
    for _ in range(20):
        study.enqueue_trial({"x": 0.1})  # WAITING (70..89)
    out = run_cli("--store", str(store), "study", "status", "busy", cwd=tmp_path).stdout
    shown = {int(line.split("│")[1]) for line in out.splitlines() if line.startswith("│")}
    assert shown == set(range(20)) | set(range(30, 50)) | set(range(80, 90))  # 20 best, 20 running, 10 latest
    assert "50 of 90 trials shown" in out and "--all shows every trial" in out
    assert "30 complete, 40 running, 20 waiting; best: trial 0 value 0" in out
    every = run_cli("--store", str(store), "study", "status", "busy", "--all", cwd=tmp_path).stdout
    assert len([line for line in every.splitlines() if line.startswith("│")]) == 90



def test_status_shows_the_epochs_the_budget_counts(tmp_path):
    # budget.epochs counts per configuration (a retry chain) its last epoch, and nothing of a warm start's
    # imported trials or of released ones: `study status` (plain SQL, no Optuna) says the same number.
    store = tmp_path / "store"
    store.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name="epochs", direction="maximize")
    study.set_user_attr("hpolab.budget_epochs", 20)

    def add(state, epochs, attrs=None):
        curve = {e: 0.1 * e for e in range(1, epochs + 1)}
        study.add_trial(create_trial(state=state, value=curve.get(epochs) if state == TrialState.COMPLETE else None, params={"x": 0.5},
                                     distributions=DIST, intermediate_values=curve, system_attrs=attrs))

    add(TrialState.COMPLETE, 4)  # 0: 4 epochs
    add(TrialState.COMPLETE, 6, {"hpolab.imported_from": "older trial 2"})  # 1: a warm start's: history, no epochs of this study
    add(TrialState.FAIL, 0, {"hpolab.released": True})  # 2: given back unrun
    add(TrialState.FAIL, 2)  # 3: interrupted after epoch 2, resumed by 4 ...
    add(TrialState.COMPLETE, 5, {"retry_history": [3], "failed_trial": 3})  # ... which carried epochs 1-2 over: 5 in all
    # 5: its epoch 2 was NaN, which a retry's carried-over history skips: 3 epochs, 2 intermediate values
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.3, params={"x": 0.5}, distributions=DIST,
                                 intermediate_values={1: 0.1, 3: 0.3}))
    used = epochs_used(study.get_trials())
    assert used == 12
    out = run_cli("--store", str(store), "study", "status", "epochs", cwd=tmp_path).stdout
    assert f"epochs used: {used} / 20 (budget.epochs)" in out, out


@pytest.mark.slow
def test_an_interrupted_and_resumed_study_and_a_warm_started_one_count_alike_everywhere(store):
    args = ["n_trials=3", "parallel=2", "trainer.max_epochs=6", "model.sleep=0.03", "log_models=none"]
    driver = start_cli("--store", str(store), "study", "run", FAULT_SPEC, *args, cwd=FAULT_PROJECT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_checkpoints(store, 2)
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=60)
    assert driver.returncode == 143, out
    out = run_cli("--store", str(store), "study", "run", FAULT_SPEC, *args, cwd=FAULT_PROJECT).stdout
    study = optuna.load_study(study_name="faulty", storage=f"sqlite:///{store / 'optuna.db'}")
    interrupted = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert len(interrupted) >= 2  # raw states: the interrupted attempts are FAIL ...
    counts = trial_counts(study)  # ... but the budget counts their copies, which finished
    assert (counts["complete"], counts["fail"], counts["retried"]) == (3, 0, len(interrupted))
    assert "3/3 finished: 3 complete, 0 pruned, 0 failed" in out  # the progress line
    row = _list_row(store, "faulty", FAULT_PROJECT)
    assert (row["complete"], row["fail"], row["running"]) == ("3", "0", "0")
    assert _status_summary(store, "faulty", FAULT_PROJECT).startswith(f"3 complete ({len(interrupted)} attempts retried: not counted)")
    check = run_cli("--store", str(store), "study", "check", "faulty", cwd=FAULT_PROJECT, check=False)
    assert check.returncode == 0, check.stdout + check.stderr  # the resumed study's stores agree

    out = run_cli("--store", str(store), "study", "run", FAULT_SPEC, "name=faulty-warm", "n_trials=1", "parallel=1",
                  "trainer.max_epochs=1", "log_models=none", "warm_start={from: faulty, top_k: 0, import_trials: true}",
                  cwd=FAULT_PROJECT).stdout
    assert "3 finished trials imported" in out and "1/1 finished: 1 complete" in out, out
    warm = optuna.load_study(study_name="faulty-warm", storage=f"sqlite:///{store / 'optuna.db'}")
    assert trial_counts(warm)["complete"] == 1 and trial_counts(warm)["imported"] == 3
    assert _list_row(store, "faulty-warm", FAULT_PROJECT)["complete"] == "1"
    assert _status_summary(store, "faulty-warm", FAULT_PROJECT).startswith("1 complete (3 imported by a warm start: not counted)")
    check = run_cli("--store", str(store), "study", "check", "faulty-warm", cwd=FAULT_PROJECT, check=False)
    assert check.returncode == 0, check.stdout + check.stderr  # imported trials need no run of their own


def test_status_of_several_objectives_caps_its_rows_and_counts_by_the_rule(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name="pareto-big",
                                directions=["maximize", "minimize"])
    study.add_trial(create_trial(state=TrialState.FAIL, params={"x": 0.5}, distributions=DIST))  # 0: resumed as 1
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[0.5, 1.0], params={"x": 0.5}, distributions=DIST,
                                 system_attrs={"retry_history": [0]}))
    for i in range(60):
        study.add_trial(create_trial(state=TrialState.COMPLETE, values=[i / 60, i], params={"x": 0.5}, distributions=DIST))
    out = run_cli("--store", str(store), "study", "status", "pareto-big", cwd=tmp_path).stdout
    assert len([line for line in out.splitlines() if line.startswith("│")]) == 50, out
    assert "the first 50 of 62 trials shown" in out and "61 complete (1 attempt retried: not counted)" in out
    every = run_cli("--store", str(store), "study", "status", "pareto-big", "--all", cwd=tmp_path).stdout
    assert len([line for line in every.splitlines() if line.startswith("│")]) == 62
