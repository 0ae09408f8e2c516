"""When a driver's retention passes go out and what they read: a pass after a finished trial reads the
study's trials only once PURGE_EVERY_S has passed or PURGE_EVERY_TRIALS trials ended here, and the
driver's last pass always reads and applies retention (real SQLite, the real tracker)."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
from mlflow import MlflowClient
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

DIST = {"x": FloatDistribution(0, 1)}


def _trial_table_reads(storage) -> list[str]:
    """The SQL statements that read the Optuna `trials` table through `storage` (real SQLite)."""
    from sqlalchemy import event

    seen: list[str] = []

    def count(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("SELECT") and "FROM trials" in statement:
            seen.append(statement)

    event.listen(storage.engine, "before_cursor_execute", count)
    return seen


def test_trials_ending_inside_the_interval_cost_no_read_and_the_last_pass_applies_retention(store):
    """A driver's retention pass after each finished trial (TrialTracker._retain, as finish() makes
    it) reads the study's trials only once PURGE_EVERY_S has passed: four trials that end inside
    the interval read nothing; the driver's last pass reads them and deletes the checkpoints of all
    but the top 1."""
    from hpolab.study.retention.retention import Retention
    from hpolab.study.trials.tracker import TrialTracker

    url = f"sqlite:///{store / 'optuna.db'}"
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = client.create_experiment("keep", artifact_location=(store / "artifacts").as_uri())
    writer = optuna.create_study(study_name="keep", storage=url, direction="maximize")  # the trials' own writes
    folders = {n: store / "trials" / "keep" / f"trial-{n}" for n in range(4)}
    runs = {}  # trial number -> its finished run, with best.pt uploaded
    for n, folder in folders.items():
        runs[n] = client.create_run(exp).info.run_id
        folder.mkdir(parents=True)
        (folder / "best.pt").write_bytes(b"best")
        client.log_artifact(runs[n], str(folder / "best.pt"), "checkpoints")
        client.set_terminated(runs[n], "FINISHED")
    storage = optuna.storages.RDBStorage(url)
    spec = SimpleNamespace(log_models="none", keep_checkpoints=SimpleNamespace(top_k=1))
    retention = Retention(spec, optuna.load_study(study_name="keep", storage=storage), folders.__getitem__)
    reads = _trial_table_reads(storage)
    notes: list[str] = []
    tracker = TrialTracker(client, exp, client.create_run(exp).info.run_id, "keep", None, {}, notes.append, retention)
    for n, value in enumerate((0.5, 0.9, 0.7, 0.3)):  # each ends inside the interval from the driver's start
        writer.add_trial(create_trial(value=value, params={"x": 0.5}, distributions=DIST,
                                      user_attrs={"mlflow_run_id": runs[n]}))
        tracker._retain()
    assert reads == []
    tracker.shutdown()  # the last pass: reads the trials and purges
    assert reads and notes == []
    for n, run_id in runs.items():
        kept = n == 1  # the best (0.9)
        assert (folders[n] / "best.pt").exists() == kept
        assert [a.path for a in client.list_artifacts(run_id, "checkpoints")] == (["checkpoints/best.pt"] if kept else [])
        assert ("hpolab.checkpoints_deleted" in client.get_run(run_id).data.tags) != kept


def test_retention_reads_the_trials_once_per_interval_and_at_the_last_pass(store, monkeypatch):
    from hpolab.study.retention import retention as ret

    url = f"sqlite:///{store / 'optuna.db'}"
    optuna.create_study(study_name="keep", storage=url, direction="maximize").add_trial(
        create_trial(value=0.5, params={"x": 0.5}, distributions=DIST))
    storage = optuna.storages.RDBStorage(url)
    study = optuna.load_study(study_name="keep", storage=storage)
    reads = _trial_table_reads(storage)
    clock = [1000.0]
    monkeypatch.setattr(ret.time, "monotonic", lambda: clock[0])
    r = ret.Retention(SimpleNamespace(log_models="all", keep_checkpoints="all"), study, lambda n: None)
    assert r.trials_due() is None and reads == []  # an interval from the start
    clock[0] += ret.PURGE_EVERY_S
    assert [t.number for t in r.trials_due()] == [0] and reads
    reads.clear()
    clock[0] += ret.PURGE_EVERY_S / 2
    assert r.trials_due() is None and reads == []  # an interval from the last read
    assert [t.number for t in r.trials_due(last=True)] == [0] and reads  # the last pass: at once
    nothing = ret.Retention(SimpleNamespace(log_models="none", keep_checkpoints="all"), study, lambda n: None)
    assert nothing.trials_due(last=True) is None  # no model to rank, nothing to delete: no read


def test_retention_passes_after_a_number_of_finished_trials_inside_the_interval(store, monkeypatch):
    """Short trials: 30 s can be a hundred trials whose checkpoints would wait, and whose deletes would
    all land on one later pass. A pass is also due once PURGE_EVERY_TRIALS trials ended here."""
    from hpolab.study.retention import retention as ret

    url = f"sqlite:///{store / 'optuna.db'}"
    optuna.create_study(study_name="keep", storage=url, direction="maximize").add_trial(
        create_trial(value=0.5, params={"x": 0.5}, distributions=DIST))
    study = optuna.load_study(study_name="keep", storage=url)
    clock = [1000.0]
    monkeypatch.setattr(ret.time, "monotonic", lambda: clock[0])
    r = ret.Retention(SimpleNamespace(log_models="none", keep_checkpoints=SimpleNamespace(top_k=1)), study, lambda n: None)
    due = [r.trials_due() is not None for _ in range(2 * ret.PURGE_EVERY_TRIALS)]  # the clock stands still
    assert [i + 1 for i, d in enumerate(due) if d] == [ret.PURGE_EVERY_TRIALS, 2 * ret.PURGE_EVERY_TRIALS]
    # only deletes make a pass due by count: ranking the models alone keeps the interval
    ranks = ret.Retention(SimpleNamespace(log_models="all", keep_checkpoints="all"), study, lambda n: None)
    assert not any(ranks.trials_due() is not None for _ in range(2 * ret.PURGE_EVERY_TRIALS))
