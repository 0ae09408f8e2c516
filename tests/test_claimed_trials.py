"""Trials between two states, through the real CLI: one claimed by a driver killed before it made the
trial's MLflow run (the next driver starts it in the same Optuna trial, a worker alive meanwhile
never crashes), one claimed when a stop signal came (not started: the re-run takes it), and a
spent epoch budget that still had a paused trial and a retry copy (nothing is promoted); and a claim
that finds a dead driver's trial gives way, so it is reaped with the budget lock free."""

from __future__ import annotations

import contextlib
import io

import optuna
import pytest
from optuna.trial import TrialState

import hpolab
from conftest import assert_study_check_clean, open_study, run_cli
from kill_harness import KINDS, assert_no_crash, finish_driver, run_driver, start_driver

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _one_trial_per_configuration(store, name: str) -> list:
    """Every trial finished, none failed or retried, each with its own MLflow run."""
    client, study = open_study(store, name)
    trials = study.get_trials()
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials), [(t.number, t.state.name) for t in trials]
    assert not [t.number for t in trials if t.system_attrs.get("retry_history")]
    runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    assert sorted(r.data.tags["optuna.trial_number"] for r in runs if "optuna.trial_number" in r.data.tags) == \
        sorted(str(t.number) for t in trials)
    return trials


@pytest.mark.slow
def test_a_trial_claimed_by_a_killed_driver_starts_in_place_and_a_live_worker_does_not_crash(store, tmp_path):
    # The driver is SIGKILLed right after claiming its second trial (owner written, no run made yet).
    first = run_driver(store, "asha", "claimed", ("claim", "after", "2"), tmp_path)
    assert first.killed_at == "claim:after:2", first.output
    # At once: the same command again, and a worker joining the study meanwhile.
    again = start_driver(store, "asha", "claimed", None, tmp_path)
    worker = start_driver(store, "asha", "claimed", None, tmp_path, worker=True)
    for proc, mark in (again, worker):
        run = finish_driver(proc, mark)
        assert_no_crash(run)
        assert "KeyError" not in run.output
    assert_study_check_clean(store, "claimed", cwd=KINDS["asha"][0])
    trials = _one_trial_per_configuration(store, "claimed")
    assert len(trials) == 4


@pytest.mark.slow
def test_a_stop_signal_while_a_trial_is_claimed_starts_nothing_and_the_rerun_takes_it(store, tmp_path):
    # SIGTERM arrives while the driver claims its second trial (under the budget lock, after the owner
    # record): "starting no new trials" must hold, for it too.
    stopped = run_driver(store, "plain", "stop-claim", ("claim", "after", "2", "TERM"), tmp_path)
    assert stopped.returncode == 143, stopped.output
    assert "starting no new trials" in stopped.output and "trial 1 started" not in stopped.output, stopped.output
    # What the stop left is no disagreement: study check exits 0 and says what the next run does with it.
    check = run_cli("--store", str(store), "study", "check", "stop-claim", cwd=KINDS["plain"][0], check=False)
    assert check.returncode == 0 and "Optuna and MLflow agree" in check.stdout, check.stdout + check.stderr
    assert "trial 1: claimed, then its driver (pid " in check.stdout and "the next `study run` starts it" in check.stdout, check.stdout
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # the Python API's check says the same
        assert hpolab.load_study("stop-claim", store=store).check() == []
    assert printed.getvalue().splitlines() == [line for line in check.stdout.splitlines() if line.startswith("trial 1: claimed, then")]
    again = run_driver(store, "plain", "stop-claim", None, tmp_path)
    assert_no_crash(again)
    assert_study_check_clean(store, "stop-claim", cwd=KINDS["plain"][0])
    _, study = open_study(store, "stop-claim")
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 2  # trial 1 ran once, in place: no FAIL, no copy


@pytest.mark.slow
def test_a_stop_signal_while_a_pbt_member_is_claimed_to_resume_leaves_it_paused(store, tmp_path):
    stopped = run_driver(store, "pbt", "stop-resume", ("resume_claimed", "after", "1", "TERM"), tmp_path)
    assert stopped.returncode == 143, stopped.output
    assert "resumed after epoch" not in stopped.output, stopped.output
    _, study = open_study(store, "stop-resume")
    assert not [t.number for t in study.get_trials() if t.state == TrialState.FAIL], stopped.output
    again = run_driver(store, "pbt", "stop-resume", None, tmp_path)
    assert_no_crash(again)
    assert_study_check_clean(store, "stop-resume", cwd=KINDS["pbt"][0])
    _one_trial_per_configuration(store, "stop-resume")


def test_a_spent_epoch_budget_promotes_no_paused_trial_even_while_a_retry_copy_waits(store):
    """budget.epochs used up, a promotable paused trial and a WAITING retry copy: the copy runs (it is
    already counted), the paused trial is not resumed (the docs: none is promoted)."""
    from types import SimpleNamespace

    from optuna.distributions import CategoricalDistribution

    from hpolab.config.spec import load_spec
    from hpolab.study.driver.claiming import claim_next
    from hpolab.study.driver.pauses import Claimed, Pauses
    from hpolab.study.objectives.schedulers import scheduler_for
    from hpolab.stores.paths import Stores
    from hpolab.stores.trial_states import PAUSED

    spec = load_spec(KINDS["asha"][0] / "studies" / "faulty.yaml",
                     ["n_trials=4", "trainer.max_epochs=2", "budget.epochs=3",
                      "trial_scheduler={type: asha, min_epochs: 1, max_epochs: 2, reduction_factor: 2}"])
    study = optuna.create_study(study_name="faulty", storage=f"sqlite:///{store / 'optuna.db'}", direction="maximize")
    dist = {"model.hidden": CategoricalDistribution([16, 32])}
    for value in (0.9, 0.1):  # paused at rung 0 (epoch 1): trial 0 is promotable (the top 1/2 of 2)
        study.add_trial(optuna.trial.create_trial(state=TrialState.RUNNING, params={"model.hidden": 16}, distributions=dist,
                                                  intermediate_values={1: value}, user_attrs={"mlflow_run_id": "r"},
                                                  system_attrs={PAUSED: {"rung": 0, "epoch": 1}}))
    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, params={"model.hidden": 32}, distributions=dist,
                                              intermediate_values={1: 0.5}))
    study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING, params={"model.hidden": 32}, distributions=dist,
                                              system_attrs={"retry_history": [2], "failed_trial": 2}))
    guard = lambda f, *a, **k: f(*a, **k)  # noqa: E731
    stores = Stores(store, f"sqlite:///{store / 'optuna.db'}", f"sqlite:///{store / 'mlflow.db'}", None)
    pauses = Pauses(scheduler_for(spec, stores), spec, stores, study, study._storage, {}, None, SimpleNamespace(note=print), guard)
    driver = SimpleNamespace(storage=study._storage, spec=spec, study=study, signals=SimpleNamespace(stopping=False), pauses=pauses,
                             outage=SimpleNamespace(call=guard), _dead_claimed=[], progress=SimpleNamespace(note=print))
    taken = claim_next(driver, reaped=True)  # (no dead driver's trial to look for)
    assert not isinstance(taken, Claimed), f"trial {taken.trial.number} was promoted with budget.epochs spent"
    assert taken is not None and taken.number == 3  # the retry copy runs
    assert [t.state for t in study.get_trials()][:2] == [TrialState.RUNNING] * 2 and all(
        t.system_attrs.get(PAUSED) for t in study.get_trials()[:2])  # both still paused


def test_a_claim_that_finds_a_dead_drivers_trial_reaps_it_with_the_budget_lock_free(store):
    """A reap restores and closes runs in MLflow, which can take long: under the budget lock it would
    hold up every other worker's claim (and `study pause|stop|set`) up to their lock timeout. The claim's
    read finds the dead trial, the claim gives way, the driver reaps with the lock free, then claims."""
    import fcntl
    import subprocess
    from types import SimpleNamespace

    from hpolab.config.spec import load_spec
    from hpolab.study.driver import claiming
    from hpolab.study.state.owners import OWNER_ATTR, owner_record

    study = optuna.create_study(study_name="faulty", storage=f"sqlite:///{store / 'optuna.db'}", direction="maximize")
    dead = study.ask()  # a trial of a driver on this host that is gone, its run made
    gone = subprocess.Popen(["true"])
    gone.wait()
    study._storage.set_trial_user_attr(dead._trial_id, OWNER_ATTR, {**owner_record(dead.number), "pid": gone.pid})
    study._storage.set_trial_user_attr(dead._trial_id, "mlflow_run_id", "r")

    def lock_free() -> bool:
        with open(store / "optuna.budget.lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f, fcntl.LOCK_UN)
            return True

    seen: list = []

    def reap() -> None:  # the driver's reap, as far as this test needs: the dead trial failed
        seen.append(("reap", lock_free(), study.trials[dead.number].state))
        study._storage.set_trial_state_values(dead._trial_id, TrialState.FAIL)

    spec = load_spec(KINDS["plain"][0] / "studies" / "faulty.yaml", ["n_trials=5"])
    driver = SimpleNamespace(storage=study._storage, spec=spec, study=study, signals=SimpleNamespace(stopping=False), pauses=None,
                             running={}, beat_watch=None, _dead_claimed=[], reap=reap, outage=SimpleNamespace(call=lambda f, *a, **k: f(*a, **k)),
                             pruning=SimpleNamespace(close_orphans=lambda s: 0))
    assert claiming.claim_next(driver) is claiming.REAP_FIRST
    assert study.trials[dead.number].state == TrialState.RUNNING and not seen  # nothing reaped under the lock
    trial = claiming.claim(driver)
    assert seen == [("reap", True, TrialState.RUNNING)], seen  # reaped once, the lock free
    assert trial is not None and trial.number == dead.number + 1  # then claimed: a new trial
