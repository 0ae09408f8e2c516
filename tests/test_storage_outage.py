"""A temporary storage outage: PostgreSQL restarts in the middle of a study.

The real CLI runs a tiny study whose Optuna storage is a real PostgreSQL server (MLflow on the
embedded SQLite store, the usual set-up of a shared Optuna database). Once a trial is RUNNING and
has reported an epoch, the server is stopped, kept down until the driver has said so on stderr,
and started again. The driver rides it out (storage_outage_grace): the running trial keeps training,
the study finishes with every trial COMPLETE, nothing is lost, and `hpolab study check` is clean. A second study keeps the server down past a short grace: the
driver stops with one line (exit 1, no traceback), and re-running the command once the server is
back finishes the study.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, run_cli, start_cli, trial_run
from services import HAVE_POSTGRES, NO_POSTGRES, as_postgres, postgres_cluster

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_POSTGRES, reason=NO_POSTGRES)]

N_TRIALS = 3
# About 13 forward calls an epoch (train + val): ~2 s an epoch, so the outage falls inside a trial.
ARGS = [f"n_trials={N_TRIALS}", "trainer.max_epochs=3", "model.sleep=0.15"]


def _wait_until(what: str, ok, driver, logs: tuple[Path, Path], timeout: float = 300) -> None:
    """Poll `ok()` until true; fail at once if the driver exits first (generous ceiling otherwise)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        if driver.poll() is not None:
            raise AssertionError(f"the driver exited {driver.returncode} before {what}:\n"
                                 f"stdout:\n{logs[0].read_text()}\nstderr:\n{logs[1].read_text()}")
        time.sleep(0.2)
    raise AssertionError(f"not in {timeout} s: {what}")


def _start(pg_ctl: str, data: Path, port: int) -> bool:
    as_postgres(pg_ctl, "-D", str(data), "-w", "-l", str(data / "log"),
                "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
    return False  # not down any more


def _a_trial_mid_run(url: str) -> bool:
    # Polled every 0.2 s: each storage's engine is disposed, or their pooled connections pile up until
    # the server refuses clients ("too many clients already": seen when the driver started slowly).
    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.load_study(study_name="faulty", storage=storage)
        return any(t.state == TrialState.RUNNING and t.intermediate_values for t in study.get_trials(deepcopy=False))
    except KeyError:
        return False  # not created yet
    finally:
        storage.engine.dispose()


@contextmanager
def _run_through_an_outage(store: Path, tmp_path: Path, args: list[str], restart_after_line: bool):
    """Run the study on a fresh cluster; stop the server mid-trial until the driver says it met the
    outage, then start it again at once (`restart_after_line`) or only after the driver exited.
    Yields (exit code, stdout, stderr, url) while the server runs again."""
    with postgres_cluster() as (bin_dir, port, data):
        as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "optuna")
        url = f"postgresql+psycopg2://postgres@127.0.0.1:{port}/optuna"
        pg_ctl = str(bin_dir / "pg_ctl")
        out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        with open(out, "w") as fo, open(err, "w") as fe:
            # An explicit env without MLFLOW_TRACKING_URI / OPTUNA_STORAGE: --store and --storage decide.
            driver = start_cli("--store", str(store), "--storage", url, "study", "run", FAULT_SPEC, *args,
                               cwd=FAULT_PROJECT, stdout=fo, stderr=fe, text=True)
            down = False
            try:
                _wait_until("a trial was RUNNING with an epoch reported", lambda: _a_trial_mid_run(url), driver, (out, err))
                as_postgres(pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop")
                down = True
                # Down until the driver has met the outage (its next epoch's report), then back.
                _wait_until("the driver said the storage is unreachable", lambda: "storage unreachable" in err.read_text(),
                            driver, (out, err))
                if restart_after_line:
                    down = _start(pg_ctl, data, port)
                driver.wait(timeout=600)
            finally:
                if driver.poll() is None:
                    driver.kill()
                    driver.wait()
                if down:  # the cluster's own clean-up needs it running (and a re-run needs it)
                    down = _start(pg_ctl, data, port)
        yield driver.returncode, out.read_text(), err.read_text(), url


def _states(url: str) -> list[TrialState]:
    return [t.state for t in optuna.load_study(study_name="faulty", storage=url).get_trials()]


def _check(store: Path, url: str) -> None:
    check = run_cli("--store", str(store), "--storage", url, "study", "check", "faulty", cwd=FAULT_PROJECT, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_postgresql_restart_mid_study_loses_nothing(store, tmp_path):
    with _run_through_an_outage(store, tmp_path, ARGS, restart_after_line=True) as (rc, stdout, stderr, url):
        assert rc == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
        assert stderr.count("storage unreachable (") == 1, stderr
        assert "retrying for up to 120 s (storage_outage_grace)" in stderr
        assert stderr.count("storage reachable again after") == 1, stderr
        assert "Traceback" not in stdout + stderr

        study = optuna.load_study(study_name="faulty", storage=url)
        trials = study.get_trials()
        # Nothing lost: the trial that ran through the outage finished, no trial failed or was retried.
        assert [t.state for t in trials] == [TrialState.COMPLETE] * N_TRIALS, [(t.number, t.state) for t in trials]
        client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
        for t in trials:
            assert sorted(t.intermediate_values) == [1, 2, 3], (t.number, t.intermediate_values)
            run = trial_run(t, client)
            assert (run.info.status, run.data.tags["hpolab.state"]) == ("FINISHED", "COMPLETE")
            assert [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")] == [1, 2, 3]
        _check(store, url)


def test_an_outage_past_the_grace_stops_the_driver_in_one_line_and_the_study_resumes(store, tmp_path):
    with _run_through_an_outage(store, tmp_path, [*ARGS, "storage_outage_grace=2"],
                                restart_after_line=False) as (rc, stdout, stderr, url):
        assert rc == 1, f"stdout:\n{stdout}\nstderr:\n{stderr}"
        assert stderr.count("storage unreachable (") == 1, stderr
        assert "hpolab: storage unreachable for " in stderr and "(storage_outage_grace=2): " in stderr, stderr
        assert "resumable" in stderr and "Traceback" not in stdout + stderr
        assert TrialState.RUNNING in _states(url)  # its trial could not be told: the next run takes it over

        rerun = run_cli("--store", str(store), "--storage", url, "study", "run", FAULT_SPEC, *ARGS, cwd=FAULT_PROJECT, check=False)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert _states(url).count(TrialState.COMPLETE) == N_TRIALS, _states(url)
        assert "storage unreachable" not in rerun.stderr  # and no grace setting is a spec change
        _check(store, url)


def test_the_budget_lock_is_left_cleanly_after_a_restart_and_is_free_again():
    """A restart while a worker holds the budget lock (between its count and its ask): leaving the lock
    must not raise (the driver would ask again) and the lock must be free for every worker after."""
    from hpolab.stores.budget_lock import budget_lock
    from hpolab.stores.optuna_storage import make_storage

    with postgres_cluster() as (bin_dir, port, data):
        as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "optuna")
        url = f"postgresql+psycopg2://postgres@127.0.0.1:{port}/optuna"
        storage = make_storage(url)
        with budget_lock(storage, "faulty") as locked:
            assert locked
            as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
            _start(str(bin_dir / "pg_ctl"), data, port)
        for worker in (make_storage(url), storage):
            with budget_lock(worker, "faulty", timeout=30) as locked:
                assert locked
