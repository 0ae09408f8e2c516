"""A trial scheduler's segment that died with its driver is put back to paused in the same trial
(driver/pauses.py): the scheduler resumes it first, a driver that still runs it (a stall, not a death)
learns it lost it, and after max_interrupts the reaper fails it as any trial. The end-to-end runs are
the SIGKILL tests of test_asha_study.py and test_pbt_study.py."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from hpolab.study.driver.heartbeat import PUT_BACK, put_back_reason
from hpolab.study.driver.pauses import Pauses
from hpolab.study.objectives.asha import Asha
from hpolab.stores.trial_states import PAUSED as PAUSED_ATTR
from hpolab.study.state.lifecycle import INTERRUPTS as INTERRUPTS_ATTR
from hpolab.study.state.owners import OWNER_ATTR, owner_record


def _study(*attrs: tuple[dict, dict, dict]) -> list:
    """Trials (RUNNING) with (intermediate values, system attrs, user attrs), in order."""
    study = optuna.create_study(direction="maximize")
    for values, system, user in attrs:
        study.add_trial(optuna.create_trial(state=TrialState.RUNNING, params={"lr": 0.1}, distributions={"lr": FloatDistribution(0.01, 1)},
                                            intermediate_values=values, system_attrs=system, user_attrs=user))
    return study.get_trials()


def test_an_interrupted_segment_resumes_first_even_where_asha_would_promote_another():
    asha = Asha(None, min_epochs=1, max_epochs=4, eta=2, brackets=1, direction="maximize")
    trials = _study(
        ({1: 0.9, 2: 0.9}, {PAUSED_ATTR: {"rung": 1, "epoch": 2}}, {}),  # the best at rung 1: promotable
        ({1: 0.5, 2: 0.1}, {PAUSED_ATTR: {"rung": 1, "epoch": 2}}, {}),
        ({1: 0.2}, {PAUSED_ATTR: {"rung": 0, "epoch": 1, "interrupted": True, "after": 1, "logged": 2}}, {}),  # worst, killed mid-segment
    )
    assert asha.next_resume(trials[:2]).number == 0
    assert asha.next_resume(trials).number == 2


def test_a_driver_still_running_a_put_back_trial_learns_it_lost_it():
    me = owner_record(0)
    other = {**owner_record(2), "pid": me["pid"] + 1}  # (a record names its trial)
    mine, put_back, claimed = _study(
        ({1: 0.5}, {}, {OWNER_ATTR: me}),
        ({1: 0.5}, {PAUSED_ATTR: {"rung": 0, "epoch": 1, "interrupted": True}}, {OWNER_ATTR: {"trial": 1, "paused": True}}),
        ({1: 0.5}, {}, {OWNER_ATTR: other}),
    )
    assert put_back_reason(mine) is None
    assert put_back_reason(put_back).put_back and put_back_reason(put_back).why.startswith(PUT_BACK)
    assert put_back_reason(claimed).put_back and str(other["pid"]) in put_back_reason(claimed).why


def test_a_trial_put_back_max_interrupts_times_is_reaped_as_any_trial():
    pauses = Pauses(None, SimpleNamespace(max_interrupts=2), None, None, None, {}, None, SimpleNamespace(note=print), None)
    (t,) = _study(({1: 0.5}, {INTERRUPTS_ATTR: 2}, {}))
    assert pauses.put_back(t, "its driver is gone") is False  # (before it touches any store)


def test_the_put_back_backfill_says_the_last_epoch_the_run_has(store, tmp_path):
    # A killed segment's run has epochs 1 and 4 (4: logged after its newest checkpoint, of epoch 3). Put back,
    # the run gets epochs 2-3 from last.pt, and the resumed segment must not log 1-4 again: the backfill's own
    # read of the metric's history says 4 (pauses.put_back then needs no second read).
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    from hpolab.study.state.metric_backfill import TAG, backfill_and_last_step
    from hpolab.train.checkpoint import save_checkpoint

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e", artifact_location=str(store / "artifacts"))).info.run_id
    client.log_batch(run_id, metrics=[Metric("val_acc", 0.1 * s, 1000 + s, s) for s in (1, 4)])
    save_checkpoint({"history": [{"epoch": e, "val_acc": 0.1 * e} for e in (1, 2, 3)]}, tmp_path / "last.pt")
    trial = _study(({1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}, {}, {}))[0]
    tags, last = backfill_and_last_step(client, run_id, trial, "val_acc", tmp_path, None, up_to=3)
    assert (tags, last) == ({TAG: "epochs 2-3 from last.pt"}, 4)
    assert sorted(m.step for m in client.get_metric_history(run_id, "val_acc")) == [1, 2, 3, 4]
    assert backfill_and_last_step(client, run_id, trial, "val_acc", tmp_path, None, up_to=3) == ({}, 4)


def test_a_put_back_reads_its_checkpoint_without_holding_the_budget_lock(store, monkeypatch):
    """Reading a dead segment's checkpoint may download it from a remote artifact store (minutes for a
    large model): meanwhile other workers' claims must not wait on the study's budget lock (their wait
    ends at HPOLAB_LOCK_TIMEOUT with exit 1)."""
    from mlflow import MlflowClient

    from hpolab.config.spec import load_spec
    from hpolab.stores import mlflow_runs as tr
    from hpolab.stores.budget_lock import budget_lock
    from hpolab.stores.paths import Stores
    from hpolab.study.objectives.schedulers import scheduler_for
    from hpolab.study.state import metric_backfill
    from conftest import FAULT_PROJECT

    spec = load_spec(FAULT_PROJECT / "studies" / "faulty.yaml",
                     ["n_trials=4", "trainer.max_epochs=2", "trial_scheduler={type: asha, min_epochs: 1, max_epochs: 2, reduction_factor: 2}"])
    stores = Stores(store, f"sqlite:///{store / 'optuna.db'}", f"sqlite:///{store / 'mlflow.db'}", None)
    client = MlflowClient(tracking_uri=stores.tracking_uri)
    run_id = client.create_run(client.create_experiment("faulty", artifact_location=str(store / "artifacts"))).info.run_id
    storage = optuna.storages.RDBStorage(stores.optuna_url)  # (as a driver's: the lock lives beside its database)
    study = optuna.create_study(study_name="faulty", storage=storage, direction="maximize")
    study.add_trial(optuna.create_trial(state=TrialState.RUNNING, params={"lr": 0.1}, distributions={"lr": FloatDistribution(0.01, 1)},
                                        user_attrs={"mlflow_run_id": run_id, OWNER_ATTR: {**owner_record(0), "pid": -1}}))
    waited = []

    def download(trial_dir, tracking_uri, run):  # another worker claims while the checkpoint downloads
        try:
            with budget_lock(storage, "faulty", timeout=1) as locked:
                assert locked
        except Exception as e:
            waited.append(f"{type(e).__name__}: {e}")
        return [{"epoch": 1, "val_acc": 0.5}]

    monkeypatch.setattr(metric_backfill, "checkpoint_history", download)
    tracker = SimpleNamespace(client=client, mlflow_guard=lambda f, *a, **k: f(*a, **k), close_run=lambda *a: None,
                              set_tags=lambda r, tags: tr.set_tags(client, r, tags))
    pauses = Pauses(scheduler_for(spec, stores), spec, stores, study, storage, {}, tracker, SimpleNamespace(note=print),
                    lambda f, *a, **k: f(*a, **k))
    assert pauses.put_back(study.get_trials()[0], "its driver is gone") is True
    assert waited == []
    assert study.get_trials()[0].system_attrs[PAUSED_ATTR]["epoch"] == 1  # put back at its checkpoint's epoch
