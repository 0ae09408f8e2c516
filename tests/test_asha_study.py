"""ASHA through the real CLI: trials pause at their rung, the top 1/eta resume from their own
checkpoint in the same Optuna trial and MLflow run, the rest end PRUNED at their rung; budget.epochs;
a driver SIGKILLed mid-rung; two workers on one study; an own training loop under ASHA."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import time

import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from conftest import assert_study_check_clean, metric_steps, open_study, run_cli, start_cli, trial_run
from hpolab.study.objectives.asha import rungs

SPEC = "studies/digits_asha.yaml"


def _args(name: str, *more: str) -> list[str]:
    return [SPEC, f"name={name}", *more]


def assert_asha_study(store, name: str, n_trials: int, top: int = 4) -> list:
    """Every configuration finished; promoted ones went on in their own run (from their checkpoint, or
    in their process: one curve 1..N, no epoch logged twice); never-promoted ones are PRUNED with the rung they reached."""
    client, study = open_study(store, name)
    trials = study.get_trials()
    assert len(trials) == n_trials
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials), [t.state for t in trials]
    runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    assert len([r for r in runs if "optuna.trial_number" in r.data.tags]) == n_trials  # one run per trial across its pauses
    promoted = 0
    for t in trials:
        run = trial_run(t, client)
        steps = metric_steps(client, run.info.run_id, "val_acc")
        last = max(t.intermediate_values)
        assert steps == list(range(1, last + 1)), (t.number, steps)  # continued its epoch axis, nothing twice
        if "hpolab.promoted_from_rung" in run.data.tags:  # (resumed in a new process, or gone on in its own)
            promoted += 1
        if t.state == TrialState.PRUNED:
            assert run.data.tags["hpolab.pruned_at_rung"] == run.data.tags["hpolab.rung"], run.data.tags
            assert run.data.tags["hpolab.state"] == "PRUNED" and run.info.status == "KILLED"
        else:
            assert last == top and run.data.tags["hpolab.state"] == "COMPLETE"
            top_rung = str(len(rungs(1, top, 2)) - 1)  # (the specs here: min_epochs 1, eta 2)
            assert run.data.tags["hpolab.rung"] == top_rung and str(t.user_attrs["hpolab.rung"]) == top_rung, (t.number, run.data.tags)
    assert promoted >= 1  # some trial was promoted
    assert_study_check_clean(store, name)
    return trials


def test_trial_scheduler_specs_are_refused_in_one_line(store):
    for override, says in [("pruner={type: median}", "pruner: 'median' cannot be combined with trial_scheduler"),
                           ("trial_scheduler.min_epochs=4", "trial_scheduler.min_epochs: must be < max_epochs"),
                           ("trial_scheduler.reduction_factor=1", "trial_scheduler.reduction_factor: Input should be greater than or equal to 2"),
                           ("search_space.trainer.max_epochs={type: int, low: 2, high: 4}", "search_space.trainer.max_epochs: a trial scheduler decides"),
                           ("budget.epochs=0", "budget.epochs: Input should be greater than or equal to 1"),
                           ("n_trials=1", "n_trials: 1 is fewer than trial_scheduler.reduction_factor x brackets (2)")]:
        out = run_cli("--store", str(store), "study", "validate", SPEC, override, check=False)
        assert out.returncode == 2, (override, out.stdout, out.stderr)
        assert says in out.stderr and "Traceback" not in out.stderr, out.stderr
    for override, says in [("trial_scheduler={type: asha, max_epochs: 4}", "trial_scheduler: needs one objective"),
                           ("budget.epochs=10", "budget.epochs: needs one objective")]:  # (several: epochs reach a companion study)
        out = run_cli("--store", str(store), "study", "validate", "studies/digits_pareto.yaml", override, "pruner={type: none}", check=False)
        assert out.returncode == 2 and says in out.stderr, (override, out.stderr)


@pytest.mark.slow
def test_trials_pause_get_promoted_and_resume_from_their_checkpoint(store):
    out = run_cli("--store", str(store), "study", "run", *_args("asha-e2e", "n_trials=5"))
    assert re.search(r"trial \d+ paused at rung 0 \(epoch 1\)", out.stdout), out.stdout
    # promoted: resumed from its checkpoint after the rung's epoch, or gone on in its process as it reached it
    assert re.search(r"trial \d+ (resumed after epoch \d|promoted at rung \d \(epoch \d\): goes on in its process)", out.stdout), out.stdout
    trials = assert_asha_study(store, "asha-e2e", 5)
    assert any(t.state == TrialState.PRUNED for t in trials)
    # every segment of a trial trains with the thread count its run records (the first segment's):
    # the count of a segment started later may differ (drivers on the host share its CPUs)
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    for t in trials:
        assert str(t.system_attrs["hpolab.torch_threads"]) == client.get_run(t.user_attrs["mlflow_run_id"]).data.tags["hpolab.torch_threads"]
    status = run_cli("--store", str(store), "study", "status", "asha-e2e").stdout
    used = sum(max(t.intermediate_values) for t in trials)
    assert f"epochs used: {used} / 40 (budget.epochs)" in status, status
    changed = run_cli("--store", str(store), "study", "run", *_args("asha-e2e", "n_trials=5", "trial_scheduler.reduction_factor=3"), check=False)
    assert changed.returncode == 2 and "trial_scheduler" in changed.stderr, changed.stderr  # rungs decided differently: refused
    run_cli("--store", str(store), "report", "asha-e2e")
    html = (store / "reports" / "asha-e2e.html").read_text()
    assert "rung: epoch 1" in html and "rung: epoch 2" in html  # the rungs on the learning curves
    pruned = sum(t.state == TrialState.PRUNED for t in trials)
    assert f'paused / pruned at a rung</div><div class="v">0 / {pruned} ' in html


@pytest.mark.slow
def test_the_epoch_budget_stops_new_trials_and_promotions(store):
    # ASHA, one at a time: 1 + 1 epochs, then the better one promoted to epoch 2: 3 used, nothing more starts
    out = run_cli("--store", str(store), "study", "run", *_args("asha-budget", "n_trials=6", "parallel=1", "budget.epochs=3"))
    assert "epochs used: 3 / 3 (budget.epochs)" in out.stdout, out.stdout + out.stderr  # (no trial reached the top: still exit 0)
    client, study = open_study(store, "asha-budget")
    trials = study.get_trials()
    assert len(trials) < 6 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert sum(max(t.intermediate_values) for t in trials) == 3
    assert_study_check_clean(store, "asha-budget")


@pytest.mark.slow
def test_the_epoch_budget_works_without_a_trial_scheduler(store):
    out = run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", "name=plain-budget", "n_trials=10", "parallel=1",
                  "trainer.max_epochs=2", "pruner={type: none}", "budget.epochs=4")
    client, study = open_study(store, "plain-budget")
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 2  # 2 + 2 epochs: the budget, then no new trial
    assert "epochs used: 4 / 4 (budget.epochs)" in out.stdout, out.stdout


def _wait_for_a_resumed_trial(store, name: str, timeout: float = 180) -> None:
    """Until a promoted trial trains its next segment (RUNNING, resumed from a pause)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, study = open_study(store, name)
            if any(t.state == TrialState.RUNNING and "hpolab.rung" in t.user_attrs and t.system_attrs.get("hpolab.paused") is None
                   for t in study.get_trials()):
                return
        except Exception:  # the study is not there yet
            pass
        time.sleep(0.2)
    raise AssertionError("no trial was resumed in time")


@pytest.mark.slow
def test_a_driver_sigkilled_mid_rung_is_continued_by_a_rerun(store):
    args = _args("asha-kill", "n_trials=5")
    driver = start_cli("--store", str(store), "study", "run", *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for_a_resumed_trial(store, "asha-kill")
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=60)
    out = run_cli("--store", str(store), "study", "run", *args)  # the same command again
    # The killed segment went back to paused in its own trial and run (no retry copy): five trials, one
    # run each, epochs 1..N once each (assert_asha_study), the study check clean.
    trials = assert_asha_study(store, "asha-kill", 5)
    assert not [t.number for t in trials if "failed_trial" in t.system_attrs], out.stdout
    client, _ = open_study(store, "asha-kill")
    interrupted = [t for t in trials if "hpolab.interrupted_at_epoch" in trial_run(t, client).data.tags]
    assert interrupted and all(t.system_attrs.get("hpolab.interrupts") == 1 for t in interrupted), out.stdout
    assert re.search(r"trial \d+ resumed after epoch \d+", out.stdout), out.stdout


@pytest.mark.slow
def test_two_workers_share_promotions_and_never_resume_a_trial_twice(store):
    args = _args("asha-two", "n_trials=6", "parallel=1")
    workers = [start_cli("--store", str(store), "study", "run", *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for _ in range(2)]
    outs = [w.communicate(timeout=300)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outs
    resumes = [m for o in outs for m in re.findall(r"trial (\d+) resumed after epoch (\d+)", o)]
    assert resumes and len(resumes) == len(set(resumes)), resumes  # no rung of a trial decided twice
    assert all(re.search(r"trial \d+ (resumed|started)", o) for o in outs), outs  # both worked
    assert_asha_study(store, "asha-two", 6)


@pytest.mark.slow
def test_an_own_training_loop_pauses_and_resumes_under_asha(store):
    # One at a time, so that which trial is promoted where does not depend on timing: trial 1 ends rung 0
    # below trial 0, which is then resumed in a new process (a promoted trial at its own pause point
    # would go on in its process instead).
    args = ["studies/digits_own_loop.yaml", "name=own-asha", "n_trials=4", "pruner=null", "parallel=1",
            "trial_scheduler={type: asha, max_epochs: 3, reduction_factor: 2}"]
    out = run_cli("--store", str(store), "study", "run", *args)
    assert "resumed after epoch" in out.stdout, out.stdout
    assert_asha_study(store, "own-asha", 4, top=3)


# A paused trial may be resumed by a worker on another host, which finds its checkpoint only in its
# MLflow run: once Optuna says a trial is paused at epoch e, its run's checkpoint must be epoch e's.
def _paused_without_their_checkpoint(store) -> list[tuple[int, int, str | None]]:
    """(trial, paused epoch, the run's uploaded checkpoint epoch) for each paused trial whose run
    does not hold its pause epoch's checkpoint yet."""
    opt = sqlite3.connect(f"file:{store / 'optuna.db'}?mode=ro", uri=True, timeout=5)
    mlf = sqlite3.connect(f"file:{store / 'mlflow.db'}?mode=ro", uri=True, timeout=5)
    try:
        rows = opt.execute("SELECT t.number, a.value_json, u.value_json FROM trials t "
                           "JOIN trial_system_attributes a ON a.trial_id = t.trial_id AND a.key = 'hpolab.paused' "
                           "JOIN trial_user_attributes u ON u.trial_id = t.trial_id AND u.key = 'mlflow_run_id' "
                           "WHERE t.state = 'RUNNING'").fetchall()
        out = []
        for number, paused, run_id in rows:
            info = json.loads(paused)
            if not isinstance(info, dict):
                continue
            tag = mlf.execute("SELECT value FROM tags WHERE run_uuid = ? AND key = 'hpolab.checkpoint_epoch'",
                              (json.loads(run_id),)).fetchone()
            if tag is None or int(tag[0]) < int(info["epoch"]):
                out.append((number, int(info["epoch"]), tag[0] if tag else None))
        return out
    except sqlite3.OperationalError:  # the tables are being created
        return []
    finally:
        opt.close()
        mlf.close()


@pytest.mark.slow
def test_a_trial_is_marked_paused_only_once_its_checkpoint_is_in_its_run(store):
    # log_models=all: every trial's model is logged on the upload thread (seconds), so a pause's
    # checkpoint upload often waits behind another trial's model
    driver = start_cli("--store", str(store), "study", "run", *_args("asha-upload", "n_trials=6", "parallel=2", "log_models=all"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    while driver.poll() is None:
        seen += _paused_without_their_checkpoint(store)
        time.sleep(0.01)
    out = driver.communicate(timeout=120)[0]  # (it exited: its output ends once its children do)
    assert driver.returncode == 0, out
    assert not seen, seen[:5]
