"""What a retry copy inherits from the attempt it retries: its configuration and what the next attempt
needs, never the marks of that attempt (its owner, its heartbeat, who reaped it). Fabricated trials
in a real store; `hpolab study check --repair` through the real CLI as the second reaper."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import optuna
from mlflow import MlflowClient
from optuna.trial import TrialState

from conftest import run_cli
from hpolab.study.driver.end_reasons import disagreement
from hpolab.study.driver.heartbeat import HEARTBEAT_ATTR, REAPED, lost_reason
from hpolab.study.state import lifecycle
from hpolab.study.state.owners import OWNER_ATTR, owner_record
from hpolab.study.state.retry import KINDS, OVERRIDES, RetryCopy

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _dead_owner(number: int) -> dict:
    """An owner record of a driver on this host that has exited (a real pid, reaped by us)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    rec = {**owner_record(number), "pid": p.pid}
    p.wait()
    return rec


def _reaped_and_retried(store, name: str = "rc"):
    """(study, the reaped attempt, its copy): an enqueued trial 0 whose owner is gone, with a heartbeat
    attr and trainer overrides, reaped by this process (the reaper every driver runs) and retried."""
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{store / 'optuna.db'}")
    study.enqueue_trial({"lr": 0.01}, user_attrs={"hpolab.warm_start_from": "other trial 3"})
    t = study.ask()
    t.suggest_float("lr", 1e-3, 1e-1, log=True)
    storage = study._storage
    storage.set_trial_user_attr(t._trial_id, OWNER_ATTR, _dead_owner(t.number))
    storage.set_trial_user_attr(t._trial_id, "mlflow_run_id", "0" * 32)
    storage.set_trial_user_attr(t._trial_id, "worker_seed", 7)
    storage.set_trial_system_attr(t._trial_id, HEARTBEAT_ATTR, time.time())
    storage.set_trial_system_attr(t._trial_id, OVERRIDES, {"micro_batch_size": 8})
    lifecycle.reap(study, storage, storage.get_trial(t._trial_id), ("owner_gone", "its driver is gone"), RetryCopy(1),
                   close=lambda *a: None, note=lambda line: None)
    attempt, copy = study.get_trials()
    return study, attempt, copy


def test_a_reaped_trials_copy_carries_its_configuration_and_none_of_its_marks(store):
    study, attempt, copy = _reaped_and_retried(store)
    assert attempt.state == TrialState.FAIL and REAPED in attempt.system_attrs
    assert copy.state == TrialState.WAITING and copy.params == attempt.params == {"lr": 0.01}
    # exactly: the chain (rebuilt), the enqueued configuration and the trainer overrides; not the reaped
    # mark, the heartbeat, the owner, the run or the seed of the attempt
    assert set(copy.system_attrs) == {"failed_trial", "retry_history", KINDS, "hpolab.retry_kind", "fixed_params", OVERRIDES}
    assert copy.system_attrs["retry_history"] == [0] and copy.system_attrs[OVERRIDES] == {"micro_batch_size": 8}
    assert copy.user_attrs == {"hpolab.warm_start_from": "other trial 3"}


def test_a_copy_whose_tell_reply_was_lost_keeps_its_model(store):
    """The copy's own tell went through (COMPLETE) but its reply was lost: it was never reaped, so its
    result and model stand (an inherited reaped mark made it look reaped: FAIL, model dropped)."""
    study, _, copy = _reaped_and_retried(store)
    t = study.ask()
    assert t.number == copy.number
    study._storage.set_trial_state_values(t._trial_id, TrialState.COMPLETE, [0.9])
    frozen = study._storage.get_trial(t._trial_id)
    tags = {"hpolab.tell_error": "OperationalError: the reply was lost"}
    state, value, model_info, retry = disagreement(frozen, TrialState.COMPLETE, 0.9, {"model": "m"}, None, tags)
    assert (state, value, model_info, retry) == (TrialState.COMPLETE, 0.9, {"model": "m"}, None), tags


def test_a_repair_that_reaps_the_copy_is_named_as_its_reaper(store):
    """The copy runs, its driver dies, `study check --repair` (another process) reaps it: the owner, if it
    were still alive, learns that the check reaped it, not the reaper of the attempt before."""
    study, _, copy = _reaped_and_retried(store)
    MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}").create_experiment("rc")
    t = study.ask()
    assert t.number == copy.number
    study._storage.set_trial_user_attr(t._trial_id, OWNER_ATTR, _dead_owner(t.number))
    study._storage.set_trial_user_attr(t._trial_id, "mlflow_run_id", "1" * 32)  # (running: its run was made)
    out = run_cli("--store", str(store), "study", "check", "rc", "--repair", check=False)
    assert f"repaired: trial {t.number}: marked FAIL" in out.stdout, out.stdout + out.stderr
    lost = lost_reason(study._storage, SimpleNamespace(trial=SimpleNamespace(_trial_id=t._trial_id)))
    assert not lost.put_back, lost  # (reaped: its run is closed FAIL here)
    assert "hpolab study check --repair" in lost.why and f"pid {os.getpid()}:" not in lost.why, lost


# ---------------------------------------------------------------- interrupts are retried, up to max_interrupts


def _interrupt_and_retry(study: optuna.Study, retry: RetryCopy, kind: str) -> int | None:
    """Run the next trial (a WAITING copy first, as the driver's ask() does), end it for `kind`."""
    from optuna.distributions import FloatDistribution

    t = study.ask({"x": FloatDistribution(0, 1)})
    study.tell(t, state=TrialState.FAIL)
    return retry(study, study.trials[t.number], kind=kind)


def test_interrupt_retries_are_bounded_by_max_interrupts():
    """A configuration that keeps losing its driver (say it takes the machine down) is not retried
    forever: its interrupts have their own bound, apart from max_retries, and the refusal says which."""
    from hpolab.config.spec import StudySpec

    assert StudySpec.model_fields["max_interrupts"].default == 10
    study = optuna.create_study()
    retry = RetryCopy(1, max_interrupts=3)
    for kind in ("interrupted", "stale", "oom", "driver"):  # 3 interrupts (and 1 own failure, of max_retries=1)
        assert _interrupt_and_retry(study, retry, kind) is not None, kind
    assert _interrupt_and_retry(study, retry, "owner_gone") is None  # the 4th interrupt of the chain
    assert retry.refusal("owner_gone") == "not retried (max_interrupts=3 reached: interrupted or its driver lost that many times)"
    assert retry.refusal("oom") == "not retried (max_retries=1 reached)"
    assert len(study.trials) == 5 and study.trials[-1].system_attrs["retry_history"] == [0, 1, 2, 3]
