"""PBT through the real CLI: every member is one Optuna trial and one MLflow run (epochs 1..max without gap
or repeat); at a boundary the worst member copies a better one's checkpoint and trains on with a
perturbed learning rate (the LR the optimizer really used changes, the schedule metric and lineage tags
say so); a driver SIGKILLed mid-population is continued by a re-run."""

from __future__ import annotations

import re
import signal
import subprocess

import pytest
from optuna.trial import TrialState

from conftest import assert_study_check_clean, hpolab_env, metric_steps, open_study, run_cli, start_cli, trial_run

# Four members, a boundary at epoch 2 of 4; a constant LR (scheduler none) makes the `lr` metric the
# configured one, so an exploit's new LR shows in what the optimizer used.
TINY = ["studies/digits_pbt.yaml", "trainer.max_epochs=4", "trainer.scheduler=none", "trainer.warmup_epochs=0",
        "model.channels=8", "trial_scheduler.mutations={trainer.lr: {factor: [0.5, 2.0]}}", "trial_scheduler.resample_probability=0"]


def _args(name: str, *more: str) -> list[str]:
    return [*TINY, f"name={name}", *more]


def test_the_tiny_pbt_spec_is_valid_with_n_trials_from_the_population(store):
    out = run_cli("--store", str(store), "study", "validate", *_args("pbt-valid"))
    assert "n_trials: 4" in out.stdout and "population: 4" in out.stdout, out.stdout


def assert_pbt_study(store, name: str, epochs: int = 4, population: int = 4) -> list:
    """Every member COMPLETE after `epochs`, one run each with one continuous curve; returns the members
    (a member's last attempt: a retry copy stands for the attempt it continued)."""
    client, study = open_study(store, name)
    trials = study.get_trials()
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    members = [t for t in trials if t.number not in retried]
    assert len(members) == population, [(t.number, t.state) for t in trials]  # n_trials == population
    assert all(t.state == TrialState.COMPLETE for t in members), [(t.number, t.state) for t in trials]
    for t in members:
        run = trial_run(t, client)
        for metric in ("val_acc", "lr"):
            assert metric_steps(client, run.info.run_id, metric) == list(range(1, epochs + 1)), (t.number, metric)
    assert_study_check_clean(store, name)
    return members


@pytest.mark.slow
def test_the_worst_member_exploits_a_better_one_and_explores_its_learning_rate(store):
    out = run_cli("--store", str(store), "study", "run", *_args("pbt-e2e"))
    client, study = open_study(store, "pbt-e2e")
    members = assert_pbt_study(store, "pbt-e2e")
    assert len(client.search_runs([client.get_experiment_by_name("pbt-e2e").experiment_id],
                                  "tags.hpolab.role = 'trial'")) == 4  # one run per member for its whole life
    exploited = [t for t in members if "hpolab.pbt_exploited_from" in trial_run(t, client).data.tags]
    assert len(exploited) == 1, out.stdout  # the bottom quarter of four at the one boundary (epoch 2)
    t = exploited[0]
    tags = trial_run(t, client).data.tags
    donor_number, at = map(int, re.fullmatch(r"(\d+)@(\d+)", tags["hpolab.pbt_exploited_from"]).groups())
    assert at == 2 and tags["hpolab.pbt_parents"] == tags["hpolab.pbt_exploited_from"] and donor_number != t.number
    donor = study.trials[donor_number]
    assert donor.intermediate_values[2] > t.intermediate_values[2]  # it copied a better member
    new_lr = t.user_attrs["hpolab.pbt_schedule"]["3"]["trainer.lr"]
    assert new_lr in (pytest.approx(donor.params["trainer.lr"] * 0.5), pytest.approx(donor.params["trainer.lr"] * 2.0))
    assert t.user_attrs["hpolab.pbt_schedule"]["1"] == {"trainer.lr": t.params["trainer.lr"]}
    assert t.user_attrs["hpolab.pbt_parents"] == [f"{donor_number}@2"]
    history = {m: {p.step: p.value for p in client.get_metric_history(trial_run(t, client).info.run_id, m)}
               for m in ("lr", "pbt.trainer.lr")}
    assert history["lr"][1] == history["lr"][2] == pytest.approx(t.params["trainer.lr"])  # its own LR before ...
    assert history["lr"][3] == history["lr"][4] == pytest.approx(new_lr)  # ... the explored one after, in the optimizer
    assert history["pbt.trainer.lr"] == {3: pytest.approx(new_lr)}  # the schedule: the value from epoch 3 on
    # (the console wraps a long line at its width: the path may start on the next line)
    assert re.search(rf"trial {t.number} resumed after epoch 2 [^\n]*(\n[^\n]*)?trial-{donor_number}/pbt_epoch_2\.pt", out.stdout), out.stdout
    assert not list((store / "trials" / "pbt-e2e").rglob("pbt_epoch_*"))  # the boundary copies are gone at the end
    for other in members:
        if other is not t:
            assert "hpolab.pbt_parents" not in trial_run(other, client).data.tags
            assert other.user_attrs["hpolab.pbt_parents"] == []

    # The replay (Ray Tune's): the member's schedule from scratch, as one run. Until the exploit its
    # numbers are the member's; after it the LR the optimizer used is the scheduled one.
    replay = run_cli("--store", str(store), "reproduce", trial_run(t, client).info.run_id, env={**hpolab_env(), "COLUMNS": "250"})
    assert "replaying its schedule from scratch" in replay.stdout and "it exploited" in replay.stdout, replay.stdout
    assert "reproduced: identical" in replay.stdout, replay.stdout
    kept = next(m for m in members if m is not t)  # a member that never exploited: its segments replayed exactly
    replay = run_cli("--store", str(store), "reproduce", trial_run(kept, client).info.run_id)
    assert "replaying its schedule" in replay.stdout and "reproduced: identical" in replay.stdout, replay.stdout


@pytest.mark.slow
def test_a_driver_sigkilled_mid_population_is_continued_by_a_rerun(store):
    args = _args("pbt-kill")
    # Each epoch's metrics handed to the upload thread at once: a driver killed within FLUSH_S of telling a member
    # COMPLETE would lose that run's last points otherwise (metric_batches.py), which is not what this test is about.
    env = {**hpolab_env(), "HPOLAB_METRICS_FLUSH_S": "0"}
    driver = start_cli("--store", str(store), "study", "run", *args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in driver.stdout:  # until the worst member resumes from a better one's checkpoint: killed in its segment
        seen.append(line)
        if "pbt_epoch_2.pt" in line:
            break
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=60)
    assert "pbt_epoch_2.pt" in seen[-1], "".join(seen)
    out = run_cli("--store", str(store), "study", "run", *args, env=env)  # the same command again
    members = assert_pbt_study(store, "pbt-kill")
    client, study = open_study(store, "pbt-kill")
    # The killed segment went back to paused in its own trial and run: no retry copy, one run per member.
    assert len(study.get_trials()) == 4 and not [t.number for t in members if "failed_trial" in t.system_attrs], out.stdout
    assert len(client.search_runs([client.get_experiment_by_name("pbt-kill").experiment_id], "tags.hpolab.role = 'trial'")) == 4
    exploited = [t for t in members if "hpolab.pbt_exploited_from" in trial_run(t, client).data.tags]
    assert len(exploited) == 1, out.stdout  # the boundary was decided once, before the kill
    interrupted = [t for t in members if "hpolab.interrupted_at_epoch" in trial_run(t, client).data.tags]
    assert exploited[0].number in [t.number for t in interrupted], out.stdout  # killed in its segment after its exploit


@pytest.mark.slow
def test_the_shipped_pbt_study_is_clean_after_its_exploits_and_each_value_is_its_own_runs(store):
    """studies/digits_pbt.yaml as shipped, never killed: `study check` is clean, and an exploited member's
    value and best epoch are what its own run logged (not its donor's best before the exploit)."""
    run_cli("--store", str(store), "study", "run", "studies/digits_pbt.yaml", "name=pbt-shipped")
    assert_study_check_clean(store, "pbt-shipped")
    client, study = open_study(store, "pbt-shipped")
    exploited = 0
    for t in study.get_trials():
        run = trial_run(t, client)
        logged = {p.step: p.value for p in client.get_metric_history(run.info.run_id, "val_acc")}
        assert t.value == max(logged.values()) and logged[int(run.data.tags["hpolab.best_epoch"])] == t.value, (t.number, logged)
        exploited += "hpolab.pbt_exploited_from" in run.data.tags
    assert exploited  # (the bottom quarter exploits at each boundary)
