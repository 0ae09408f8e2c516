"""One state per trial in both stores: Optuna's state is the truth MLflow records.

Logic first (fabricated trials, pipes and runs; real Optuna and MLflow stores), then the real CLI in
tests/fault_project: a trial reaped while its owner still runs it, a study metric that is never
finite, a configuration interrupted twice, and a run that a killed driver never linked to its trial.
(A driver's file descriptors over many trials: tests/test_driver_fds.py.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from multiprocessing import Pipe
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from mlflow import MlflowClient
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, open_study, run_cli, start_cli, trial_run

optuna.logging.set_verbosity(optuna.logging.WARNING)


# ---------------------------------------------------------------- retries: what consumes max_retries


def _fail_and_retry(study: optuna.Study, retry, kind: str) -> int | None:
    """Run the next trial (a WAITING copy first, as the driver's ask() does), fail it for `kind`."""
    t = study.ask({"x": FloatDistribution(0, 1)})
    study.tell(t, state=TrialState.FAIL)
    return retry(study, study.trials[t.number], kind=kind)


def test_interrupts_and_dead_drivers_never_use_up_max_retries():
    from hpolab.study.state.retry import RetryCopy

    study = optuna.create_study()
    retry = RetryCopy(1)
    for kind in ("interrupted", "interrupted", "owner_gone", "stale", "driver", "reaped"):
        assert _fail_and_retry(study, retry, kind) is not None, kind  # free: the configuration comes back
    assert _fail_and_retry(study, retry, "oom") is not None  # the trial's own failure: 1 of max_retries=1
    assert _fail_and_retry(study, retry, "interrupted") is not None  # still free after that
    assert _fail_and_retry(study, retry, "timeout") is None  # the second failure of its own: spent
    last = study.trials[-1]
    assert last.system_attrs["retry_history"] == list(range(8))
    assert last.system_attrs["hpolab.retry_kinds"] == ["interrupted", "interrupted", "owner_gone", "stale", "driver", "reaped",
                                        "oom", "interrupted"]


def test_a_chain_recorded_without_kinds_counts_as_before():
    from hpolab.study.state.retry import RetryCopy

    study = optuna.create_study()
    t = study.ask({"x": FloatDistribution(0, 1)})
    study.tell(t, state=TrialState.FAIL)
    study.add_trial(optuna.create_trial(state=TrialState.WAITING, params=t.params, distributions=t.distributions,
                                        system_attrs={"retry_history": [0], "failed_trial": 0}))  # an older version's copy
    retry = RetryCopy(1)
    assert _fail_and_retry(study, retry, "interrupted") is not None  # an interrupt is free, whatever came before
    assert _fail_and_retry(study, retry, "oom") is None  # the unknown first link counted: 2 > max_retries


# ---------------------------------------------------------------- the child's last message


class _ExitsAfterSending:
    """A child process that sends its result and exits in the moment between the driver's drain of
    its pipe and its is_alive() check (a race seen in a suite run)."""

    def __init__(self, child_conn, msg):
        self.child_conn, self.msg, self.exitcode = child_conn, msg, 0

    def is_alive(self) -> bool:
        if self.child_conn is not None:
            self.child_conn.send(self.msg)
            self.child_conn.close()
            self.child_conn = None
        return False

    def join(self, timeout=None) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_result_sent_just_before_the_exit_is_not_missed(tmp_path):
    from hpolab.study.driver.events import TrialEvents
    from hpolab.study.trials.runner import Running, TrialRunner

    seen = []

    class Recording(TrialEvents):
        def on_fail(self, r, info):
            seen.append(("fail", info["reason"]))
            self.running.pop(r.number)

        def on_exit_without_result(self, r):
            seen.append(("exit", None))
            self.running.pop(r.number)

    parent, child = Pipe(duplex=True)
    r = Running(trial=SimpleNamespace(number=0), run_id="run", config={}, trial_dir=tmp_path,
                process=_ExitsAfterSending(child, ("fail", {"kind": "exception", "reason": "boom"})), conn=parent)
    running = {0: r}
    events = Recording(None, None, running, None, TrialRunner("x", "x", 1, tmp_path), None, "val_acc", None, None,
                       stopping=lambda: False, aborting=lambda: False)
    events.handle(r)
    assert seen == [("fail", "boom")]


def _lost_trial(tmp_path, lost):
    from hpolab.study.trials.runner import Running

    parent, child = Pipe(duplex=True)
    life_read, life_write = Pipe(duplex=False)
    r = Running(trial=SimpleNamespace(number=0), run_id="run", config={}, trial_dir=tmp_path, conn=parent, lifeline=life_write)
    r.lost = lost
    return r, child, life_read


@pytest.mark.parametrize("put_back", [True, False])
def test_a_lost_trial_is_stopped_here_and_ended_only_when_it_was_not_put_back(tmp_path, put_back):
    """What a lost trial becomes follows its kind, not the words of its reason: a reaped trial whose
    reason reads like a put-back one is still closed FAIL here."""
    from hpolab.study.driver.events import TrialEvents
    from hpolab.study.driver.heartbeat import PUT_BACK
    from hpolab.study.trials.runner import Lost, TrialRunner

    ended, notes = [], []

    class Recording(TrialEvents):
        def finish(self, r, state, tags, *args, **kwargs):
            ended.append((state, tags["hpolab.fail_reason"]))
            self.running.pop(r.number)

    why = f"{PUT_BACK} (its heartbeats were stale); it resumes there"
    r, child, life_read = _lost_trial(tmp_path, Lost(why, put_back=put_back))
    running = {0: r}
    tracker = SimpleNamespace(metrics=SimpleNamespace(forget=lambda run_id: None))
    events = Recording(None, None, running, tracker, TrialRunner("x", "x", 1, tmp_path), SimpleNamespace(note=notes.append),
                       "val_acc", None, None, stopping=lambda: False, aborting=lambda: False)
    events.handle(r)
    assert running == {}
    if put_back:
        assert ended == [] and notes == [f"trial 0: {why}; stopped here"]
        assert r.conn.closed and r.lifeline.closed
        assert life_read.poll(1) and child.poll(1)  # (the child's ends see EOF: its process exits)
    else:
        assert ended == [(TrialState.FAIL, why)] and notes == []


def test_closing_a_trials_pipes_twice_or_without_pipes_is_harmless(tmp_path):
    r, _, _ = _lost_trial(tmp_path, None)
    r.close_pipes()
    r.close_pipes()
    assert r.conn.closed and r.lifeline.closed
    r.conn = r.lifeline = None
    r.close_pipes()


def test_a_resumed_segment_does_not_log_the_epochs_its_run_already_has(store, tmp_path):
    """A dead driver's segment logged epochs up to 4: the worker that resumes the trial at epoch 3 logs from 5."""
    from hpolab.study.trials.runner import Running
    from hpolab.study.trials.tracker import TrialTracker

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    tracker = TrialTracker(client, "0", "parent", "s", None, {}, note=print)
    r = Running(trial=SimpleNamespace(number=0), run_id="run", config={}, trial_dir=tmp_path, epoch=3)
    other = Running(trial=SimpleNamespace(number=1), run_id="other", config={}, trial_dir=tmp_path, epoch=3)
    tracker.resume(r, {}, {}, logged=4)
    tracker.metrics.start(other.run_id)
    try:
        for epoch in (4, 5):
            tracker.log_epoch(r, epoch, {"val_acc": 0.5})
            tracker.log_epoch(other, epoch, {"val_acc": 0.5})
        assert [m.step for m in r.metric_points] == [5]
        assert [m.step for m in other.metric_points] == [4, 5]
    finally:
        tracker.uploads.close()


@pytest.mark.parametrize("kind, checkpointed, pauses", [
    ("routine", 2, True),  # (fit writes last.pt every epoch: the trial process says so)
    ("own loop", 2, True),
    ("own loop", 1, False),  # its last trial.checkpoint is older than its pause: a resume would train epoch 2 again
    ("own loop", None, False),
])
def test_a_trial_pauses_at_its_rung_only_with_a_checkpoint_of_that_epoch_whichever_its_loop(tmp_path, kind, checkpointed, pauses):
    from hpolab.study.driver.events import TrialEvents
    from hpolab.study.trials.runner import Running, TrialRunner

    seen = []

    class Recording(TrialEvents):
        def finish(self, r, state, tags, *args, **kwargs):
            seen.append((state, tags.get("hpolab.fail_kind")))

    # (the summary does not say which loop ran: the driver decides on the checkpoint's epoch alone)
    info = {"epochs_run": 2, "stop_reason": "stopped_by_caller", "last_checkpoint_epoch": checkpointed, "best_epoch": 2}
    scheduler = SimpleNamespace(pausing=lambda r, i: True, read=lambda r: None, never_finite=lambda r, frozen: False,
                                pause=lambda r, i, frozen: seen.append(("paused", i["epochs_run"])))
    spec = SimpleNamespace(trial_scheduler=SimpleNamespace(type="asha"), pruner=SimpleNamespace(type="none"),
                           objective_list=[SimpleNamespace(metric="val_acc")], is_multi_objective=False)
    r = Running(trial=SimpleNamespace(number=0), run_id="run", config={}, trial_dir=tmp_path)
    events = Recording(None, None, {0: r}, None, TrialRunner("x", "x", 1, tmp_path), None, "val_acc", None, None,
                       stopping=lambda: False, aborting=lambda: False, spec=spec, pauses=scheduler)
    events.on_done(r, info)
    assert seen == ([("paused", 2)] if pauses else [(TrialState.FAIL, "contract")])


def test_a_failed_tell_never_leaves_mlflow_saying_complete():
    from hpolab.study.driver.end_reasons import disagreement

    reaped = optuna.create_trial(state=TrialState.FAIL, params={}, distributions={},
                                 system_attrs={"hpolab.reaped": "host-b pid 7: its driver is gone"})
    tags = {"hpolab.best_val_acc": "0.9"}
    state, value, model, retry = disagreement(reaped, TrialState.COMPLETE, 0.9, {"model": 1}, None, tags)
    assert (state, value, model, retry) == (TrialState.FAIL, None, None, None)
    assert tags["hpolab.fail_kind"] == "reaped" and "reaped by another worker (host-b pid 7" in tags["hpolab.fail_reason"]

    tags = {"hpolab.fail_reason": "interrupted", "hpolab.tell_error": "OperationalError: gone"}
    state, _, _, retry = disagreement(None, TrialState.FAIL, None, None, "interrupted", tags)  # cannot be read back
    assert (state, retry) == (TrialState.FAIL, None) and tags["hpolab.fail_kind"] == "tell"
    assert tags["hpolab.fail_reason"].startswith("Optuna could not record its end (OperationalError: gone)")

    done = optuna.create_trial(state=TrialState.COMPLETE, value=0.9, params={}, distributions={})
    assert disagreement(done, TrialState.COMPLETE, 0.9, {"model": 1}, None, {}) == (TrialState.COMPLETE, 0.9, {"model": 1}, None)


# ---------------------------------------------------------------- a storage outage (the real restart: test_storage_outage.py)


def _refused(wrapped_by_optuna: bool = True) -> Exception:
    """The error a restarting PostgreSQL gives: psycopg2's OperationalError inside SQLAlchemy's (and Optuna's)."""
    import psycopg2
    from sqlalchemy.exc import OperationalError

    e = OperationalError("connect", {}, psycopg2.OperationalError('connection to server at "db" failed: Connection refused'))
    if not wrapped_by_optuna:
        return e
    try:
        raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
    except optuna.exceptions.StorageInternalError as wrapped:
        return wrapped


def test_connection_errors_are_retried_until_the_store_answers_and_others_raise_at_once():
    import sqlite3

    from sqlalchemy.exc import IntegrityError, OperationalError

    from hpolab.errors import StudyError
    from hpolab.study.state.outage import StorageOutage, unreachable

    assert unreachable(_refused()) is not None and unreachable(_refused(False)) is not None
    assert unreachable(OperationalError("x", {}, sqlite3.OperationalError("database is locked"))) is None  # a local file
    assert unreachable(IntegrityError("x", {}, Exception("duplicate key"))) is None

    lines: list[str] = []
    failures = [_refused(), _refused()]

    def flaky() -> str:
        if failures:
            raise failures.pop()
        return "answered"

    outage = StorageOutage(120, write=lines.append)
    assert outage.call(flaky) == "answered"
    assert len(lines) == 2 and lines[0].startswith("storage unreachable (OperationalError: ") and \
        "retrying for up to 120 s (storage_outage_grace)" in lines[0] and lines[1].startswith("storage reachable again after")

    with pytest.raises(ValueError):  # not a connection error: raised as before, not retried
        outage.call(lambda: int("x"))
    assert len(lines) == 2

    def down():
        raise _refused()

    gone = StorageOutage(0, write=lines.append)  # storage_outage_grace: 0 = give up at once
    with pytest.raises(StudyError, match=r"storage unreachable for 0 s \(storage_outage_grace=0\): OperationalError: .*resumable"):
        gone.call(down)
    with pytest.raises(optuna.exceptions.StorageInternalError):  # spent: the error path is not held up again
        gone.call(down)


def test_a_tell_whose_reply_was_lost_is_not_told_twice():
    from hpolab.study.driver.events import TrialEvents
    from hpolab.study.trials.runner import Running

    study = optuna.create_study(direction="maximize")
    trial = study.ask({"x": FloatDistribution(0, 1)})

    def reply_lost(fn, *args, **kwargs):  # the first call reached the database; the retry runs it again
        fn(*args, **kwargs)
        return fn(*args, **kwargs)

    events = TrialEvents(study, study._storage, {}, None, None, None, "val_acc", None, None,
                         stopping=lambda: False, aborting=lambda: False, guard=reply_lost)
    r = Running(trial=trial, run_id="run", config={}, trial_dir=Path("."))
    tags: dict[str, str] = {}
    frozen = events._tell(r, TrialState.COMPLETE, 0.9, tags)
    assert (frozen.state, frozen.value, tags) == (TrialState.COMPLETE, 0.9, {})


# ---------------------------------------------------------------- retention and a RUNNING run


def test_retention_never_touches_the_files_of_a_running_run(store):
    from hpolab.study.retention.retention import Retention

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = client.create_experiment("keep", artifact_location=(store / "artifacts").as_uri())
    run = client.create_run(exp)  # another worker's trial: Optuna has it finished, its uploads still queued
    folder = store / "trials" / "keep" / "trial-3"
    folder.mkdir(parents=True)
    for name in ("last.pt", "best.pt"):
        (folder / name).write_bytes(b"checkpoint")
    spec = SimpleNamespace(log_models="complete", keep_checkpoints=SimpleNamespace(top_k=1), direction="maximize")
    retention = Retention(spec, None, lambda n: folder)
    items = [("checkpoints", 3, run.info.run_id, folder)]

    retention.purge(client, items)
    assert (folder / "last.pt").exists() and (folder / "best.pt").exists()
    assert "hpolab.checkpoints_deleted" not in client.get_run(run.info.run_id).data.tags

    client.set_terminated(run.info.run_id, "FINISHED")  # its worker closed it: a later pass deletes
    retention.purge(client, items)
    assert not (folder / "last.pt").exists() and not (folder / "best.pt").exists()
    assert client.get_run(run.info.run_id).data.tags["hpolab.checkpoints_deleted"] == "keep_checkpoints: top_k 1"


def test_a_reaper_never_overwrites_the_close_of_an_owner_that_was_alive(store):
    # The reaper fails the trial in Optuna, queues its retry, then closes the run; an owner that was
    # alive closes the run itself, saying it still ran (after the reaper's close, or past its wait for
    # it: TrialTracker's REAPER_CLOSE_WAIT). A run its owner closed first keeps the owner's reason.
    from hpolab.stores import mlflow_runs as tr

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = client.create_experiment("reap", artifact_location=(store / "artifacts").as_uri())
    owner_closed, still_open = client.create_run(exp).info.run_id, client.create_run(exp).info.run_id
    tr.set_tags(client, owner_closed, {"hpolab.fail_reason": "reaped by another worker (h pid 1: gone) while it still ran here"})
    client.set_terminated(owner_closed, "FAILED")
    reaper = {"hpolab.state": "FAIL", "hpolab.fail_reason": "its driver is gone; retried as trial 1"}

    assert tr.close_if_running(client, owner_closed, reaper, "FAILED") is False
    assert client.get_run(owner_closed).data.tags["hpolab.fail_reason"].startswith("reaped by another worker")
    assert tr.close_if_running(client, still_open, reaper, "FAILED") is True  # a dead owner's run: closed here
    run = client.get_run(still_open)
    assert run.info.status == "FAILED" and run.data.tags["hpolab.fail_reason"] == reaper["hpolab.fail_reason"]


# ---------------------------------------------------------------- the real CLI


def _start(store: Path, *args: str, spec: str = FAULT_SPEC, env: dict | None = None):
    return start_cli("--store", str(store), "study", "run", spec, *args, cwd=FAULT_PROJECT, env=env,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(path: Path, driver, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return
        if driver.poll() is not None:
            raise AssertionError(f"the driver exited {driver.returncode} before {path} existed:\n{driver.stdout.read()}")
        time.sleep(0.1)
    raise AssertionError(f"{path} did not appear in time")


def _models_of(client, study) -> set[str]:
    exp = client.get_experiment_by_name(study.study_name)
    return {m.source_run_id for m in client.search_logged_models([exp.experiment_id])}


def _states_agree(client, study) -> None:
    for t in study.get_trials():
        run = trial_run(t, client)
        assert run.data.tags["hpolab.state"] == t.state.name, (t.number, t.state, run.data.tags)
        assert run.info.status == {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}[t.state.name]


@pytest.mark.slow
def test_a_trial_reaped_while_its_owner_runs_it_ends_fail_in_both_stores(store):
    from hpolab.stores import mlflow_runs as tr
    from hpolab.stores.optuna_storage import open_storage
    from hpolab.study.driver.heartbeat import reap_dead_trials
    from hpolab.study.state.owners import OWNER_ATTR
    from hpolab.study.state.retry import RetryCopy

    # Trial 0 must still be training when it is reaped, on a loaded machine too: after its first
    # checkpoint its model waits while the hold file exists (model.fault=hold); the file goes after the reap.
    storage = open_storage(f"sqlite:///{store / 'optuna.db'}")
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    client.search_experiments()
    hold = store.parent / "hold"
    hold.touch()
    env = {**hpolab_env(), "HPOLAB_HEARTBEAT_INTERVAL": "1", "HPOLAB_TEST_HOLD": str(hold)}
    driver = _start(store, "n_trials=2", "parallel=1", "trainer.max_epochs=12", "model.sleep=0.03",
                    "model.fault=hold", "model.fault_after=20", env=env)
    _wait_for(store / "trials" / "faulty" / "trial-0" / "last.pt", driver)

    # Another worker's reaper believes trial 0's owner dead (as when the owner's heartbeat writes
    # failed for the grace period; here its owner record names a pid that is gone): FAIL, a retry
    # copy, its run closed FAILED. The owner is alive and still training it.
    study = optuna.load_study(study_name="faulty", storage=storage)
    t0 = study.trials[0]
    storage.set_trial_user_attr(t0._trial_id, OWNER_ATTR, {**t0.user_attrs[OWNER_ATTR], "pid": 4194304 + 7, "start_time": "0"})

    def close_run(run_id, state, tags):  # as the driver's Tracker.close_run_if_open (tr.close_if_running)...
        assert client.get_run(run_id).info.status == "RUNNING"
        # ...on a loaded machine: a pause between its check and its write, long enough for the owner to
        # notice the reap (its next heartbeat) and close the run. The owner waits for this close and
        # then writes its reason over it; were it not to wait, this write would bury its reason.
        time.sleep(3)
        tr.set_tags(client, run_id, {"hpolab.state": state.name, **tags})
        client.set_terminated(run_id, status="FAILED")

    notes: list[str] = []
    reap_dead_trials(study, storage, {}, RetryCopy(1), close_run, notes.append)
    hold.unlink()
    assert notes and "is gone; retried as trial" in notes[0], notes
    out, _ = driver.communicate(timeout=600)
    assert driver.returncode == 0, out

    client, study = open_study(store)
    trials = study.get_trials()
    reaped = trials[0]
    assert reaped.state == TrialState.FAIL
    run = trial_run(reaped, client)
    assert "reaped by another worker" in run.data.tags["hpolab.fail_reason"], run.data.tags
    assert run.data.tags["hpolab.fail_kind"] == "reaped"
    assert len(client.get_metric_history(run.info.run_id, "val_acc")) < 12  # its child was stopped
    assert run.info.run_id not in _models_of(client, study)
    copies = [t for t in trials if t.system_attrs.get("retry_history") == [0]]
    assert len(copies) == 1 and copies[0].state == TrialState.COMPLETE  # one retry, not two
    assert len([t for t in trials if t.state == TrialState.COMPLETE]) == 2, out
    _states_agree(client, study)


@pytest.mark.slow
def test_a_study_metric_never_finite_is_a_fail_in_both_stores(store):
    out = run_cli("--store", str(store), "study", "run", "studies/nanmetric.yaml", "n_trials=3", "max_failures=2",
                  cwd=FAULT_PROJECT, check=False)
    assert out.returncode == 1 and "2 trials failed in a row" in out.stderr, out.stdout + out.stderr
    client, study = open_study(store, "nanmetric")
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL]
    for t in trials:
        tags = trial_run(t, client).data.tags
        assert "the study metric val_score was never finite" in tags["hpolab.fail_reason"], tags
        assert tags["hpolab.fail_kind"] == "metric"
    assert _models_of(client, study) == set()
    _states_agree(client, study)


@pytest.mark.slow
def test_a_configuration_interrupted_twice_resumes_and_completes(store):
    # The reproduction: max_retries=1, parallel=1, Ctrl-C twice while the same configuration trains.
    args = ["n_trials=3", "parallel=1", "max_retries=1", "trainer.max_epochs=10", "model.sleep=0.03", "log_models=none"]
    for attempt in (0, 1):  # trial 1 is the retry copy of trial 0: the same configuration
        driver = _start(store, *args)
        _wait_for(store / "trials" / "faulty" / f"trial-{attempt}" / "last.pt", driver)
        driver.send_signal(signal.SIGINT)
        out, _ = driver.communicate(timeout=300)
        assert driver.returncode == 130, out
    run_cli("--store", str(store), "study", "run", FAULT_SPEC, *args, cwd=FAULT_PROJECT)

    client, study = open_study(store)
    trials = study.get_trials()
    chain = [t for t in trials if t.system_attrs.get("retry_history", [None])[0] == 0]
    assert chain[-1].state == TrialState.COMPLETE and chain[-1].params == trials[0].params
    assert chain[-1].system_attrs["hpolab.retry_kinds"] == ["interrupted", "interrupted"]
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    final = [t for t in trials if t.number not in retried]
    assert len(final) == 3 and all(t.state == TrialState.COMPLETE for t in final), [(t.number, t.state) for t in trials]
    _states_agree(client, study)


@pytest.mark.slow
def test_a_run_its_killed_driver_never_linked_is_removed_by_the_driver_that_takes_its_trial_over(store):
    """A driver SIGKILLed between making a trial's MLflow run and putting its id on the trial leaves
    a claimed trial (no run id on it) and a RUNNING run that no trial points at. The next driver takes
    the trial over in the same Optuna trial (nothing of it was trained) and deletes that run: when it
    ends, the trial has one run and both stores agree."""
    from hpolab.stores import mlflow_runs as tr
    from hpolab.study.state.owners import OWNER_ATTR, owner_record

    run_cli("--store", str(store), "study", "run", FAULT_SPEC, "n_trials=1", "log_models=none", cwd=FAULT_PROJECT)
    client, study = open_study(store)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    trial = study.ask()  # trial 1, RUNNING, owned by a driver that is gone (same host, its pid has exited)
    trial.set_user_attr(OWNER_ATTR, {**owner_record(trial.number), "pid": int(dead.stdout), "start_time": -1.0})
    exp = client.get_experiment_by_name("faulty")
    unlinked = tr.start_child_run(client, exp.experiment_id, study.user_attrs["mlflow_parent_run_id"], "faulty", trial.number, {})

    out = run_cli("--store", str(store), "study", "run", FAULT_SPEC, "n_trials=2", "log_models=none", cwd=FAULT_PROJECT)
    assert "trial 1: its driver died before starting it; started here, in the same trial" in out.stdout, out.stdout + out.stderr
    assert client.get_run(unlinked).info.lifecycle_stage == "deleted"
    client, study = open_study(store)
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert study.get_trials()[1].user_attrs["mlflow_run_id"] != unlinked
    run_cli("--store", str(store), "study", "check", "faulty", cwd=FAULT_PROJECT)
