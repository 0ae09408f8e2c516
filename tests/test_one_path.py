"""Both kinds of experiment, the routine's (load_data + build_model) and an own loop (train(config,
trial)), behave the same when a trial stops and goes on: paused and resumed by ASHA, retried after its
driver was SIGKILLed, resumed by PBT with an explored learning rate. Each kind trains the same bias model
(tests/one_path.py says the arithmetic its records follow), through the real CLI.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import assert_study_check_clean, open_study, run_cli, start_cli, trial_run
from one_path import KINDS, PROJECT, SPEC, assert_each_epoch_went_on_from_the_last, assert_one_curve, records, study_run

pytestmark = pytest.mark.slow

ASHA = ["n_trials=4", "search_space={trainer.lr: {type: categorical, choices: [0.05, 0.1, 0.15, 0.2]}}",
        "trial_scheduler={type: asha, min_epochs: 1, max_epochs: 4, reduction_factor: 2, brackets: 1}"]
PBT = ["trainer.max_epochs=2", "search_space={trainer.lr: {type: categorical, choices: [0.05, 0.2]}}",
       "trial_scheduler={type: pbt, population: 2, interval_epochs: 1, quantile: 0.5, "
       "mutations: {trainer.lr: {factor: [0.5, 2.0]}}, resample_probability: 0}"]


@pytest.mark.parametrize("kind", list(KINDS))
def test_asha_pauses_and_resumes_each_trial_in_one_run_that_goes_on_from_its_checkpoint(store, kind):
    study_run(store, kind, *ASHA)
    client, study = open_study(store, "bias")
    trials = study.get_trials()
    exp = client.get_experiment_by_name("bias").experiment_id
    assert len(client.search_runs([exp], "tags.hpolab.role = 'trial'")) == len(trials) == 4  # one run per trial
    resumed = []
    for t in trials:
        run = trial_run(t, client)
        recorded = records(client, run.info.run_id)
        epochs = max(t.intermediate_values)
        assert_one_curve(recorded, epochs)
        assert t.intermediate_values == dict(recorded["val_score"])
        assert_each_epoch_went_on_from_the_last(recorded)
        if "hpolab.resumed_after_epoch" in run.data.tags:
            first = int(run.data.tags["hpolab.resumed_after_epoch"]) + 1
            assert dict(recorded["train_loss"])[first] < 1.0  # not a fresh model's loss: the checkpoint's weights
            resumed.append((t.number, first, epochs))
    assert [e for _, _, e in resumed if e == 4] and {t.state for t in trials} == {TrialState.COMPLETE, TrialState.PRUNED}, resumed
    assert_study_check_clean(store, "bias", cwd=PROJECT)


def _wait_for_epoch(store: Path, epoch: int, timeout: float = 120) -> None:
    from hpolab.train.checkpoint import load_checkpoint

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for last in (store / "trials" / "bias").glob("trial-*/last.pt"):
            try:
                if load_checkpoint(last)["epoch"] >= epoch:
                    return
            except Exception:  # being replaced this moment
                pass
        time.sleep(0.05)
    raise AssertionError(f"no trial checkpointed epoch {epoch} in time")


# With no pruner both kinds train on while the driver answers an epoch; a stop abandons the epoch in
# progress in both: the routine reads the answer before each batch, an own loop is interrupted in its
# code (study/trials/stop_interrupt.py).
@pytest.mark.parametrize("kind, how", [("routine", "SIGKILL"), ("own_loop", "SIGKILL"), ("routine", "SIGTERM"), ("own_loop", "SIGTERM")])
def test_a_trial_whose_driver_was_killed_or_stopped_is_retried_from_its_checkpoints_epoch(store, tmp_path, kind, how):
    trace = tmp_path / "trained.txt"  # a line per batch trained: the process id that trained it
    args = ["n_trials=1", "search_space={}", "sampler={type: random}", "trainer.max_epochs=4", "trainer.batch_size=2",
            "model.sleep=0.25", f"model.trace={trace}"]
    driver = start_cli("--store", str(store), "study", "run", SPEC, f"experiment={KINDS[kind]}", *args, cwd=PROJECT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for_epoch(store, 2)
    driver.send_signal(getattr(signal, how))
    stopped, _ = driver.communicate(timeout=60)
    assert driver.returncode == (-9 if how == "SIGKILL" else 143), stopped
    out = run_cli("--store", str(store), "study", "run", SPEC, f"experiment={KINDS[kind]}", *args, cwd=PROJECT)  # the same command again
    if how == "SIGKILL":
        assert "is gone; retried as trial" in out.stdout, out.stdout
    client, study = open_study(store, "bias")
    [retry] = [t for t in study.get_trials() if t.system_attrs.get("retry_history")]
    assert retry.state == TrialState.COMPLETE
    run = trial_run(retry, client)
    after = int(run.data.tags["hpolab.resumed_after_epoch"])
    assert 2 <= after < 4
    recorded = records(client, run.info.run_id)
    assert_one_curve(recorded, 4)  # the killed attempt's epochs carried over
    assert_each_epoch_went_on_from_the_last(recorded, steps=4)
    trained = trace.read_text().split()
    killed, retried = trained[0], trained[-1]
    # the killed attempt trained the checkpoint's epochs (and maybe part of the next), the retry the epochs after them only
    assert killed != retried and trained == [killed] * (len(trained) - 4 * (4 - after)) + [retried] * 4 * (4 - after), (after, trained)
    assert trained.count(killed) >= 4 * after
    assert_study_check_clean(store, "bias", cwd=PROJECT)
    if how == "SIGTERM":  # a stop abandons the epoch under way: the one after the checkpoint's is not trained to its end
        assert trained.count(killed) < 4 * (after + 1), (after, trained)


@pytest.mark.parametrize("kind", list(KINDS))
def test_pbt_trains_a_member_on_with_the_explored_learning_rate_from_the_checkpoint_it_copied(store, kind):
    study_run(store, kind, *PBT)
    client, study = open_study(store, "bias")
    members = study.get_trials()
    assert [t.state for t in members] == [TrialState.COMPLETE] * 2
    by_lr = {t.params["trainer.lr"]: t for t in members}
    exploited, donor = by_lr[0.05], by_lr[0.2]  # epoch 1: the bias is 0.1 at lr 0.05, 0.4 (the target) at lr 0.2
    assert trial_run(exploited, client).data.tags["hpolab.pbt_exploited_from"] == f"{donor.number}@1"
    new_lr = exploited.user_attrs["hpolab.pbt_schedule"]["2"]["trainer.lr"]
    assert new_lr in (pytest.approx(0.1), pytest.approx(0.4))  # the donor's 0.2, halved or doubled
    recorded = records(client, trial_run(exploited, client).info.run_id)
    assert_one_curve(recorded, 2)
    assert dict(recorded["lr"]) == {1: pytest.approx(0.05), 2: pytest.approx(new_lr)}
    donors = dict(records(client, trial_run(donor, client).info.run_id)["val_pred"])
    # epoch 2 trained from the donor's weights (0.4, not its own 0.1) by a step of the new learning rate
    assert_each_epoch_went_on_from_the_last(recorded, start={2: donors[1]})
    assert_study_check_clean(store, "bias", cwd=PROJECT)
    # its replay: the schedule from scratch, the donor's stretch then its own with the new learning rate
    replay = run_cli("--store", str(store), "reproduce", trial_run(exploited, client).info.run_id, cwd=PROJECT)
    assert "replaying its schedule" in replay.stdout and "reproduced: identical" in replay.stdout, replay.stdout
