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
