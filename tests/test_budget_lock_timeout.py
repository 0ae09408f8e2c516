"""The budget lock gives up after a bounded wait with a clear error.

A hung holder (here: another connection / file descriptor that took the lock and never lets go)
must not stall every worker: the waiter raises StudyError naming the lock within its timeout, on a
real throw-away PostgreSQL (pg_advisory_lock) and on SQLite (flock); a worker whose budget lock is
held exits 1 with that one line. The waits run in a thread with a generous ceiling, so on code
without a timeout the test fails instead of hanging.
"""

from __future__ import annotations

import fcntl
import threading

import optuna
import pytest

import hpolab.stores.budget_lock as bl
from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, run_cli
from hpolab.errors import StudyError
from services import HAVE_POSTGRES, NO_POSTGRES, as_postgres, postgres_cluster

CEILING = 120  # seconds: far above the 2 s lock timeout, only reached when the wait is unbounded


def _wait_in_thread(storage, name: str) -> dict:
    result: dict = {}

    def take() -> None:
        try:
            with bl.budget_lock(storage, name):
                result["took"] = True
        except BaseException as e:
            result["error"] = e

    th = threading.Thread(target=take, daemon=True)
    th.start()
    th.join(CEILING)
    result["stuck"] = th.is_alive()
    result["thread"] = th
    return result


@pytest.fixture(scope="module")
def postgres_url():
    if not HAVE_POSTGRES:
        pytest.skip(NO_POSTGRES)
    with postgres_cluster() as (bin_dir, port, data):
        as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "optuna")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/optuna"


def test_postgres_advisory_lock_times_out_with_a_clear_error(postgres_url, monkeypatch):
    import sqlalchemy

    monkeypatch.setattr(bl, "LOCK_TIMEOUT", 2.0, raising=False)
    storage = optuna.storages.RDBStorage(postgres_url)
    holder = sqlalchemy.create_engine(postgres_url).connect()  # the hung worker's session
    holder.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": bl._key("s")})
    holder.commit()
    try:
        result = _wait_in_thread(storage, "s")
    finally:
        holder.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": bl._key("s")})
        holder.commit()
        holder.close()
    result["thread"].join(30)
    assert not result["stuck"], "the budget lock waited without a bound"
    assert isinstance(result.get("error"), StudyError), result
    assert "budget lock of study 's'" in str(result["error"]) and "pg_locks" in str(result["error"])
    with bl.budget_lock(storage, "s") as locked:  # released: taken at once, and given back
        assert locked


def test_sqlite_flock_times_out_with_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(bl, "LOCK_TIMEOUT", 2.0, raising=False)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    with open(tmp_path / "optuna.budget.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # the hung holder
        result = _wait_in_thread(storage, "s")
    result["thread"].join(30)
    assert not result["stuck"], "the budget lock waited without a bound"
    assert isinstance(result.get("error"), StudyError), result
    assert "optuna.budget.lock" in str(result["error"])


@pytest.mark.slow
def test_a_worker_whose_budget_lock_is_held_exits_1_with_one_line(store):
    env = {**hpolab_env(), "HPOLAB_LOCK_TIMEOUT": "3"}
    with open(store / "optuna.budget.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        out = run_cli("--store", str(store), "study", "run", FAULT_SPEC, "n_trials=1", "log_models=none", cwd=FAULT_PROJECT, env=env,
                      check=False, timeout=CEILING + 60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "timed out after 3 s waiting for the budget lock of study 'faulty'" in out.stderr
    assert "Traceback" not in out.stderr
