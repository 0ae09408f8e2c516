"""A trial's process is forked before its segment starts (TrialRunner.prepare): it sets up meanwhile,
writes nothing and trains only once told "go" (spawn_trial); a start that does not happen ends it."""

from __future__ import annotations

import time

import optuna
import pytest

from hpolab.config.spec import load_experiment, load_spec
from hpolab.study.trials.runner import Running, runner_for

from conftest import ROOT

SPEC = ROOT / "studies" / "bench_multifidelity.yaml"


@pytest.fixture
def runner_and_trial(tmp_path):
    spec = load_spec(SPEC, ["trainer.max_epochs=2", "parallel=1"])
    runner = runner_for(spec, ROOT)
    runner.start_forkserver()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trial = optuna.create_study().ask()
    config = spec.resolved_config(load_experiment(spec.experiment))
    r = Running(trial=trial, run_id="", config=config, trial_dir=tmp_path / "trial-0")
    r.trial_dir.mkdir()
    yield runner, r
    if r.process is not None and r.process.is_alive():
        r.process.kill()
        r.process.join(10)


def _message(r: Running, timeout: float):
    assert r.conn.poll(timeout), f"no message from the trial process in {timeout} s"
    return r.conn.recv()


@pytest.mark.slow
def test_a_prepared_trial_process_trains_only_once_told_go(runner_and_trial):
    runner, r = runner_and_trial
    runner.prepare(r, None, [r])
    time.sleep(3.0)  # ample time to set up and train an epoch of this tiny MLP, were it not waiting
    assert r.process.is_alive()
    assert not r.conn.poll(0), "the prepared process sent something before its segment started"
    assert not list(r.trial_dir.glob("*.pt")), "the prepared process wrote a checkpoint before its segment started"
    pid = r.process.pid
    runner.spawn_trial(r, None, [r])
    assert r.process.pid == pid, "spawn_trial forked again instead of starting the prepared process"
    msg = _message(r, 60)
    assert msg[:2] == ("epoch", 1), msg
    r.conn.send("stop")
    assert _message(r, 60)[0] == "done"


def test_a_prepared_process_whose_start_did_not_happen_ends_having_written_nothing(runner_and_trial):
    runner, r = runner_and_trial
    runner.prepare(r, None, [r])
    time.sleep(1.0)
    process = r.process
    runner.discard(r)
    process.join(10)
    assert not process.is_alive()
    assert r.prepared is None
    assert not list(r.trial_dir.glob("*.pt"))
    runner.discard(r)  # (twice, or after a start: a no-op)


def test_a_start_with_other_threads_than_prepared_forks_a_new_process(runner_and_trial):
    runner, r = runner_and_trial
    if runner.cpus() < 2:
        pytest.skip("needs 2 CPUs: a count other than the prepared one, within the CPUs")
    r.threads = 2
    runner.prepare(r, None, [r])
    first = r.process
    r.threads = 1  # (a later segment takes the count its trial recorded: pauses.plan)
    runner.spawn_trial(r, None, [r])
    assert r.process is not first
    first.join(10)
    assert not first.is_alive()
    assert _message(r, 60)[:2] == ("epoch", 1)
