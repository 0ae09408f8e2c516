"""Steering a running study: `study pause | resume | stop [--now] | set` and Study.pause/.set/...

Logic first (the run controls checked as overrides are, the control record's versions) on Optuna
studies made here; then two real workers on one embedded store, steered through the CLI from
another working directory. tests/test_steer_distributed.py does the same on PostgreSQL + an MLflow
server + the gRPC storage proxy.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, assert_study_check_clean, open_study, run_cli, start_cli
from hpolab.config.controls import seconds_of
from hpolab.config.run_controls import check_controls
from hpolab.config.spec import load_spec
from hpolab.errors import SpecError
from hpolab.stores.control import CONTROL_ATTR, applied_by, change_control, read_control
from hpolab.study.driver.spec_guard import defining_spec

ROOT = Path(__file__).resolve().parents[1]
# slow enough trials (about 5 s) that a command lands while they run
WORKER = [FAULT_SPEC, "name=steer", "n_trials=40", "trainer.max_epochs=8", "model.sleep=0.04", "log_models=none",
          "sampler={type: random}"]


# ---------------------------------------------------------------- logic


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1d", 86400), ("45", 45.0),
                                           (" 2h 15m ", 8100)])
def test_durations(text, seconds):
    assert seconds_of(text) == seconds


def test_a_bad_duration_names_the_field():
    with pytest.raises(SpecError) as e:
        load_spec(ROOT / "studies" / "digits_cnn.yaml", ["timeout=soon"])
    assert e.value.problems == ["timeout: 'soon': give seconds (7200) or a duration such as 90s, 30m, 2h, 1h30m"]


def test_run_controls_are_checked_as_overrides_are():
    assert check_controls(["n_trials=60", "parallel=1", "timeout=2h", "budget.epochs=400"], None, "s") == {
        "n_trials": 60, "parallel": 1, "timeout": 7200.0, "budget.epochs": 400}
    with pytest.raises(SpecError) as e:
        check_controls(["n_trials=0", "timeout=soon"], None, "s")
    assert e.value.problems == ["n_trials: Input should be greater than or equal to 1",
                                "timeout: 'soon': give seconds (7200) or a duration such as 90s, 30m, 2h, 1h30m"]
    with pytest.raises(SpecError, match="trainer.lr: not a run control"):
        check_controls(["trainer.lr=0.1"], None, "s")
    with pytest.raises(SpecError, match="give at least one key=value"):
        check_controls([], None, "s")


def test_run_controls_are_checked_against_the_recorded_spec():
    """A PBT study's n_trials is its population: the recorded spec says so, `study set` refuses another."""
    recorded = defining_spec(load_spec(ROOT / "studies" / "digits_pbt.yaml"))
    with pytest.raises(SpecError, match="n_trials: 7 differs from trial_scheduler.population"):
        check_controls(["n_trials=7"], recorded, "pbt")
    assert check_controls(["parallel=2"], recorded, "pbt") == {"parallel": 2}


def test_control_versions_accumulate_values_and_drivers_say_they_applied():
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, study_name="c")
    assert read_control(storage, study._study_id).version == 0
    first = change_control(storage, "c", "set n_trials=9", "me@here pid 1", values={"n_trials": 9})
    second = change_control(storage, "c", "pause", "me@here pid 1", state="paused")
    third = change_control(storage, "c", "stop --now", "me@here pid 1", state="stopped", stop="now")
    assert (first.version, second.version, third.version) == (1, 2, 3)
    assert (second.state, second.values, third.stop) == ("paused", {"n_trials": 9}, "now")
    assert read_control(storage, study._study_id) == third
    resumed = change_control(storage, "c", "resume", "me@here pid 1", state="running")
    assert resumed.stop is None and resumed.values == {"n_trials": 9}
    storage.set_study_system_attr(study._study_id, "hpolab.control_applied.a:1", {"version": 4, "at": "2", "worker": "a pid 1"})
    storage.set_study_system_attr(study._study_id, "hpolab.control_applied.b:2", {"version": 3, "at": "1", "worker": "b pid 2"})
    attrs = storage.get_study_system_attrs(study._study_id)
    assert [a["worker"] for a in applied_by(attrs, 4)] == ["a pid 1"] and CONTROL_ATTR in attrs


def test_the_commands_refuse_a_missing_study_and_a_bad_value(store, tmp_path):
    optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name="there")
    out = run_cli("--store", str(store), "study", "pause", "nothere", cwd=tmp_path, check=False)
    assert out.returncode == 2 and "no study named 'nothere'" in out.stderr and "there" in out.stderr
    out = run_cli("--store", str(store), "study", "set", "there", "parallel=0", "max_trials=3", cwd=tmp_path, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "max_trials: not a run control" in out.stderr  # (every problem at once; the unknown key first)
    out = run_cli("--store", str(store), "study", "set", "there", "parallel=0", cwd=tmp_path, check=False)
    assert out.returncode == 2 and "parallel: Input should be greater than or equal to 1" in out.stderr
    assert read_control(optuna.storages.RDBStorage(f"sqlite:///{store / 'optuna.db'}"), 1).version == 0  # nothing written
    done = run_cli("--store", str(store), "study", "stop", "there", "--now", cwd=tmp_path)
    assert "study there: stop --now (control v1)" in done.stdout
    status = run_cli("--store", str(store), "study", "status", "there", cwd=tmp_path).stdout
    assert "control: stopped (now) (v1: stop --now by " in status
    assert "applied (v1) by: no driver yet" in status


# ---------------------------------------------------------------- two workers through the CLI


def wait_for(path: Path, text: str, count: int = 1, timeout: float = 180) -> str:
    """The file's text once `text` shows in it `count` times (AssertionError with the text after `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = path.read_text()
        if out.count(text) >= count:
            return out
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {path} ({count}x) after {timeout:g} s:\n{path.read_text()}")


def start_workers(store: Path, outs: list[Path], args: list[str], envs=None) -> list:
    """A worker per output file; `envs`: each one's environment (its stores), None: the tests' own."""
    return [start_cli("--store", str(store), "worker", *args, cwd=FAULT_PROJECT, env=envs[i] if envs else None, stdout=o.open("w"),
                      stderr=subprocess.STDOUT) for i, o in enumerate(outs)]


def steer(store_args: list[str], *command: str, cwd: Path, env=None) -> str:
    return run_cli(*store_args, "study", *command, cwd=cwd, env=env).stdout


def running_trials(study) -> list:
    return [t for t in study.get_trials() if t.state == TrialState.RUNNING]


def pause_set_resume(store_args: list[str], outs: list[Path], workers: list, study, cwd: Path, env=None, set_via=None) -> None:
    """Both workers run trials; pause: both say so, their running trials finish and no trial starts;
    set n_trials: both apply it; resume: they run up to it and exit 0 by themselves."""
    for o in outs:
        wait_for(o, "started")
    assert "(control v1)" in steer(store_args, "pause", "steer", cwd=cwd, env=env)
    for o in outs:
        wait_for(o, "study control v1 (pause, by ")
    deadline = time.monotonic() + 120
    while running_trials(study) and time.monotonic() < deadline:
        time.sleep(0.5)
    held = len(study.get_trials())
    assert not running_trials(study)
    time.sleep(4)  # paused: several loop turns of both workers, and no trial starts
    assert len(study.get_trials()) == held and all(w.poll() is None for w in workers)
    status = steer(store_args, "status", "steer", cwd=cwd, env=env)
    assert "control: paused (v1: pause by " in status
    assert status.count(" pid ") >= 3 and str(workers[0].pid) in status and str(workers[1].pid) in status  # both applied it
    target = held + 2
    steer(set_via or store_args, "set", "steer", f"n_trials={target}", "timeout=2h", cwd=cwd, env=env)
    for o in outs:
        wait_for(o, f"set n_trials 40 -> {target}, timeout None -> 7200.0")
    steer(store_args, "resume", "steer", cwd=cwd, env=env)
    codes = [w.wait(timeout=300) for w in workers]
    assert codes == [0, 0], [o.read_text() for o in outs]
    for o in outs:
        assert "study control v3 (resume, by " in o.read_text()
    finished = [t for t in study.get_trials() if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)]
    assert len(finished) == target and not running_trials(study)


def stop_and_stop_now(store_args: list[str], store: Path, outs: list[Path], study, cwd: Path, env=None, envs=None) -> None:
    """stop: running trials finish, both workers exit 0 before the budget; a worker started now runs
    nothing; resume + stop --now: the running trials stop after an epoch, resumable (a retry copy)."""
    steer(store_args, "resume", "steer", cwd=cwd, env=env)
    steer(store_args, "set", "steer", "n_trials=40", cwd=cwd, env=env)
    workers = start_workers(store, outs, WORKER, envs)
    for o in outs:
        wait_for(o, "started")
    steer(store_args, "stop", "steer", cwd=cwd, env=env)
    assert [w.wait(timeout=300) for w in workers] == [0, 0], [o.read_text() for o in outs]
    for o in outs:
        assert "stopping: no new trials; running trials" in o.read_text()
    states = [t.state for t in study.get_trials()]
    assert TrialState.RUNNING not in states and len(states) < 40
    assert TrialState.FAIL not in states  # drained: every running trial finished
    late = start_workers(store, outs[:1], WORKER, envs)[0]
    assert late.wait(timeout=300) == 0
    assert "starting no trial" in outs[0].read_text() and len(study.get_trials()) == len(states)
    steer(store_args, "resume", "steer", cwd=cwd, env=env)
    workers = start_workers(store, outs, WORKER, envs)
    for o in outs:
        wait_for(o, "started")
    steer(store_args, "stop", "steer", "--now", cwd=cwd, env=env)  # (8 epochs to go: it lands mid-trial)
    assert [w.wait(timeout=300) for w in workers] == [0, 0], [o.read_text() for o in outs]
    for o in outs:
        assert "stopping now: running trials" in o.read_text()
    interrupted = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    copies = [t for t in study.get_trials() if t.state == TrialState.WAITING]
    assert interrupted and not running_trials(study)
    assert len(copies) == len(interrupted)  # each resumes from its checkpoint on the next run


@pytest.mark.slow
def test_two_workers_on_the_embedded_store_are_paused_set_resumed_and_stopped(store, tmp_path):
    outs = [tmp_path / "w0.txt", tmp_path / "w1.txt"]
    store_args = ["--store", str(store)]
    workers = start_workers(store, outs, WORKER)
    wait_for(outs[0], "started")
    _, study = open_study(store, "steer")
    pause_set_resume(store_args, outs, workers, study, cwd=tmp_path)
    stop_and_stop_now(store_args, store, outs, study, cwd=tmp_path)
    assert_study_check_clean(store, "steer", cwd=FAULT_PROJECT)


def test_the_python_api_steers_a_study(store):
    import hpolab

    optuna.create_study(storage=f"sqlite:///{store / 'optuna.db'}", study_name="api")
    study = hpolab.load_study("api", store=store)
    assert study.set(n_trials=60, timeout="30m").values == {"n_trials": 60, "timeout": 1800.0}
    assert study.set({"budget.epochs": 400}).values == {"n_trials": 60, "timeout": 1800.0, "budget.epochs": 400}
    assert (study.pause().state, study.resume().state) == ("paused", "running")
    stop = study.stop(now=True)
    assert (stop.version, stop.state, stop.stop, stop.change) == (5, "stopped", "now", "stop --now")
    with pytest.raises(SpecError, match="parallel: Input should be greater than or equal to 1"):
        study.set(parallel=0)
