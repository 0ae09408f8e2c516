"""`hpolab study check`: clean on a real study; each disagreement, made by editing a copy of its
stores, is reported (exit 1, one row) and fixed by --repair where it can be; --json parses; a
study that does not exist is one line and exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from conftest import STUDY, copy_store, run_cli
from hpolab.analysis.check import find_problems
from hpolab.analysis.check_read import _read_sql, _read_through_clients
from hpolab.cli import main
from hpolab.stores.paths import resolve_stores
from hpolab.stores.mlflow_runs import start_child_run

pytestmark = pytest.mark.slow  # the shared study is built with the real CLI


@pytest.fixture
def store(template, tmp_path):
    return copy_store(template, tmp_path / "store")


def _open(store):
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{store / 'optuna.db'}")
    return client, study


def _by_state(study, state):
    return next(t for t in study.get_trials() if t.state == state)


def check(store, *flags, capsys):
    """The CLI in this process (argument parsing, exit codes): (exit code, stdout). First, the same
    problems whether the stores are read with plain SQL or through Optuna and MLflow's clients."""
    stores = resolve_stores(str(store))
    sql, clients = (find_problems(read(STUDY, stores)) for read in (_read_sql, _read_through_clients))
    assert [(p.trial, p.what, p.fix, p.repair is None) for p in sql] == [(p.trial, p.what, p.fix, p.repair is None) for p in clients]
    capsys.readouterr()
    code = main(["--store", str(store), "study", "check", STUDY, *flags])
    return code, capsys.readouterr().out


def assert_found_then_repaired(store, capsys, needle: str, repairable: bool = True):
    code, out = check(store, capsys=capsys)
    assert code == 1 and needle in out, out
    code, out = check(store, "--json", capsys=capsys)
    problems = json.loads(out)
    assert code == 1 and [p for p in problems if needle in p["what"]], problems
    assert all(set(p) == {"trial", "what", "fix", "repairable", "repaired"} for p in problems)
    code, out = check(store, "--repair", capsys=capsys)
    if not repairable:
        assert code == 1 and needle in out, out
        return out
    assert code == 0 and "repaired:" in out and "Optuna and MLflow agree" in out, out
    code, out = check(store, capsys=capsys)
    assert code == 0 and len(out.strip().splitlines()) == 1, out
    return out


def test_clean_study_real_cli_and_json(template):
    t0 = time.monotonic()
    out = run_cli("--store", str(template), "study", "check", STUDY)
    assert out.stdout.strip().endswith("Optuna and MLflow agree") and len(out.stdout.strip().splitlines()) == 1, out.stdout
    out = run_cli("--store", str(template), "study", "check", "studies/digits_cnn.yaml", "--json", check=False)
    assert out.returncode == 2  # the spec's name is digits-cnn, not in this store
    out = run_cli("--store", str(template), "study", "check", STUDY, "--json")
    assert json.loads(out.stdout) == []
    print(f"two checks in {time.monotonic() - t0:.1f} s")


def test_unknown_study_is_one_line_exit_2(template):
    out = run_cli("--store", str(template), "study", "check", "no-such-study", check=False)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("hpolab: no study named 'no-such-study'") and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_optuna_fail_but_mlflow_complete(store, capsys):
    client, study = _open(store)
    t = _by_state(study, TrialState.FAIL)
    run_id = t.user_attrs["mlflow_run_id"]
    client.set_tag(run_id, "hpolab.state", "COMPLETE")
    client.set_terminated(run_id, "FINISHED")
    assert_found_then_repaired(store, capsys, "Optuna says FAIL")
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["hpolab.state"] == "FAIL"


def test_running_trial_of_a_dead_driver(store, capsys):
    client, study = _open(store)
    dead = subprocess.Popen(["true"])
    dead.wait()
    trial = study.ask()
    trial.set_user_attr("hpolab.owner", {"host": __import__("socket").gethostname(), "boot_id": "", "pid": dead.pid,
                                         "start_time": "1", "trial": trial.number})
    exp = client.get_experiment_by_name(STUDY)
    run_id = start_child_run(client, exp.experiment_id, study.user_attrs["mlflow_parent_run_id"], STUDY, trial.number, {})
    trial.set_user_attr("mlflow_run_id", run_id)
    assert_found_then_repaired(store, capsys, "is gone")
    _, study = _open(store)
    trials = study.get_trials()
    assert trials[trial.number].state == TrialState.FAIL
    assert trials[-1].state == TrialState.WAITING and trials[-1].system_attrs["retry_history"] == [trial.number]
    assert client.get_run(run_id).info.status == "FAILED"


def test_interrupted_attempt_not_queued_to_resume(store, capsys):
    client, study = _open(store)
    t = _by_state(study, TrialState.FAIL)
    client.set_tag(t.user_attrs["mlflow_run_id"], "hpolab.fail_kind", "interrupted")
    assert_found_then_repaired(store, capsys, "owes a retry copy, which was never queued")
    _, study = _open(store)
    assert study.get_trials()[-1].system_attrs["retry_history"] == [t.number]


def test_missing_checkpoint_uploaded_again_or_recorded(store, capsys):
    client, study = _open(store)
    t = _by_state(study, TrialState.COMPLETE)
    run = client.get_run(t.user_attrs["mlflow_run_id"])
    best = store / "artifacts" / run.info.run_id / "artifacts" / "checkpoints" / "best.pt"
    local = store / "trials" / STUDY / f"trial-{t.number}" / "best.pt"
    shutil.copy(best, local)  # the trial folder's copy: deleted once uploaded, an older store has it
    best.unlink()
    assert_found_then_repaired(store, capsys, "no checkpoints/best.pt")
    assert best.is_file()  # the local trial folder still had it: uploaded again
    best.unlink()
    local.unlink()
    assert_found_then_repaired(store, capsys, "no checkpoints/best.pt")
    assert "missing" in client.get_run(run.info.run_id).data.tags["hpolab.checkpoints_deleted"]


def test_missing_model_and_complete_without_model(store, capsys):
    client, study = _open(store)
    a, b = [t for t in study.get_trials() if t.state == TrialState.COMPLETE][:2]
    model_id = client.get_run(a.user_attrs["mlflow_run_id"]).data.tags["hpolab.model_id"]
    shutil.rmtree(store / "artifacts" / "models" / model_id)
    run_b = b.user_attrs["mlflow_run_id"]
    client.delete_tag(run_b, "hpolab.model_uri")
    client.delete_tag(run_b, "hpolab.model_id")
    assert_found_then_repaired(store, capsys, "which is missing")
    assert "no model was logged" in client.get_run(run_b).data.tags["hpolab.model_error"]


def test_parent_left_running_and_wrong_counts(store, capsys):
    client, study = _open(store)
    parent = study.user_attrs["mlflow_parent_run_id"]
    client.update_run(parent, status="RUNNING")
    assert_found_then_repaired(store, capsys, "no worker is running")
    assert client.get_run(parent).info.status == "FINISHED"  # the budget (4) is spent
    client.set_tag(parent, "hpolab.trials_complete", "7")
    assert_found_then_repaired(store, capsys, "hpolab.trials_complete='7'")


def test_deleted_run_orphan_run_and_wrong_tags(store, capsys):
    client, study = _open(store)
    t0, t1 = study.get_trials()[:2]
    client.delete_run(t0.user_attrs["mlflow_run_id"])
    client.set_tag(t1.user_attrs["mlflow_run_id"], "optuna.trial_number", "9")
    exp = client.get_experiment_by_name(STUDY)
    orphan = start_child_run(client, exp.experiment_id, study.user_attrs["mlflow_parent_run_id"], STUDY, 0, {})
    code, out = check(store, capsys=capsys)
    assert code == 1 and "is deleted" in out and "optuna.trial_number='9'" in out and orphan in out, out
    code, out = check(store, "--repair", capsys=capsys)
    assert code == 0, out
    assert client.get_run(t0.user_attrs["mlflow_run_id"]).info.lifecycle_stage == "active"
    assert client.get_run(orphan).info.status == "KILLED"  # kept, closed and marked
    assert client.get_run(orphan).data.tags["hpolab.orphan"]


def test_retry_run_that_does_not_name_its_attempt(store, capsys):
    client, study = _open(store)
    t = _by_state(study, TrialState.FAIL)
    client.set_tag(t.user_attrs["mlflow_run_id"], "hpolab.fail_kind", "interrupted")
    check(store, "--repair", capsys=capsys)  # queues the retry copy
    _, study = _open(store)
    copy = study.get_trials()[-1]
    exp = client.get_experiment_by_name(STUDY)
    run_id = start_child_run(client, exp.experiment_id, study.user_attrs["mlflow_parent_run_id"], STUDY, copy.number, {})
    # Ran (as a driver would: its run linked, COMPLETE) but its run lost the retry tags
    storage = study._storage
    storage.set_trial_state_values(copy._trial_id, TrialState.RUNNING)
    storage.set_trial_user_attr(copy._trial_id, "mlflow_run_id", run_id)
    storage.set_trial_state_values(copy._trial_id, TrialState.FAIL)
    client.set_tag(run_id, "hpolab.state", "FAIL")
    client.set_tag(run_id, "hpolab.fail_reason", "x")
    client.set_terminated(run_id, "FAILED")
    code, out = check(store, capsys=capsys)
    assert code == 1 and f"retry of trial {t.number}, but its run does not say so" in out, out
    code, out = check(store, "--repair", capsys=capsys)
    assert code == 0, out
    assert client.get_run(run_id).data.tags["hpolab.retry_of_trial"] == str(t.number)
