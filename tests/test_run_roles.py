"""Which runs of a study's experiment are trial runs (stores/run_roles.py): those tagged
`hpolab.role=trial`, and in stores written before the role was set on trial runs, those with
`optuna.trial_number` and no role. A promote run names a trial number too, and is none.
(Through the real CLI: tests/test_promote.py, study check and a driver's repair after a promote.)"""

from __future__ import annotations

from hpolab.stores.run_roles import is_trial_run


def test_a_trial_run_is_told_by_its_role_and_an_old_one_by_its_trial_number():
    assert is_trial_run({"hpolab.role": "trial", "optuna.trial_number": "3"})
    assert not is_trial_run({"hpolab.role": "promote", "optuna.trial_number": "3"})
    assert not is_trial_run({"hpolab.role": "study", "optuna.study": "s"})
    assert not is_trial_run({"hpolab.role": "lr_range_test"})
    assert is_trial_run({"optuna.trial_number": "3", "optuna.study": "s"})  # an older store's trial run
    assert not is_trial_run({"optuna.study": "s"})  # an older store's parent run


def test_taking_a_claimed_race_trial_over_deletes_only_the_races_unlinked_run(store):
    """A promotion race's seed runs live in the study's experiment and their trial numbers repeat the
    study's: a resumed race that takes its claimed trial 0 over deletes its own unlinked run of trial
    0, never the study's trial 0 run (real SQLite stores)."""
    import optuna
    from mlflow import MlflowClient

    from hpolab.study.state.repair import delete_unlinked_runs

    uri, storage = f"sqlite:///{store / 'mlflow.db'}", f"sqlite:///{store / 'optuna.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("s", artifact_location=str(store / "artifacts"))

    def run(study: str) -> str:
        return client.create_run(exp, tags={"hpolab.role": "trial", "optuna.study": study, "optuna.trial_number": "0"}).info.run_id

    study = optuna.create_study(study_name="s", storage=storage)
    t = study.ask()
    studys_run = run("s")
    study._storage.set_trial_user_attr(t._trial_id, "mlflow_run_id", studys_run)
    race = optuna.create_study(study_name="s.race-k", storage=storage)
    race.ask()  # claimed; its driver died after making its run and before linking it
    races_unlinked = run("s.race-k")

    assert delete_unlinked_runs(client, exp, race, 0) == 1
    assert client.get_run(races_unlinked).info.lifecycle_stage == "deleted"
    assert client.get_run(studys_run).info.lifecycle_stage == "active"
    assert delete_unlinked_runs(client, exp, study, 0) == 0  # the study's own run is linked
