"""PostgreSQL connections stay bounded with many workers: each process's Optuna storage pools at most
POOL_SIZE connections (stores/optuna_storage.py), so N workers hold at most N * POOL_SIZE of the Optuna
database's connections (docs/how-to/scaling-out.md), counted in pg_stat_activity while they run."""

from __future__ import annotations

import subprocess
import sys
import threading

import optuna
import psycopg2
import pytest
from optuna.trial import TrialState

from conftest import ROOT, hpolab_env, run_cli, start_cli
from services import HAVE_POSTGRES, NO_POSTGRES, as_postgres, free_port, postgres_cluster, wait_for_http
from hpolab.stores.optuna_storage import POOL_SIZE, make_storage

pytestmark = pytest.mark.skipif(not HAVE_POSTGRES, reason=NO_POSTGRES)


@pytest.fixture(scope="module")
def cluster():
    with postgres_cluster() as (bin_dir, port, _):
        for db in ("optuna", "mlflow"):
            as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", db)
        yield port


def _connections(port: int, database: str = "optuna") -> int:
    con = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")
    try:
        cur = con.cursor()
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND datname = %s", (database,))
        return cur.fetchone()[0]
    finally:
        con.close()


class _Sampler:
    """The most connections to `database` seen, sampled every `every` seconds while the block runs."""

    def __init__(self, port: int, every: float = 0.05) -> None:
        self.port, self.every, self.peak, self._stop = port, every, 0, threading.Event()

    def __enter__(self):
        def loop():
            while not self._stop.is_set():
                self.peak = max(self.peak, _connections(self.port))
                self._stop.wait(self.every)
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_one_storage_never_holds_more_than_its_pool(cluster):
    """Twelve threads of one process (a driver's main thread, heartbeats, uploads...) query at once:
    they share POOL_SIZE connections, waiting for one rather than opening more."""
    from sqlalchemy import text

    storage = make_storage(f"postgresql+psycopg2://postgres@127.0.0.1:{cluster}/optuna")
    start = threading.Barrier(12)

    def query():
        start.wait()
        with storage.engine.connect() as con:
            con.execute(text("SELECT pg_sleep(0.3)"))

    with _Sampler(cluster) as sampled:
        threads = [threading.Thread(target=query) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    storage.engine.dispose()
    assert 1 <= sampled.peak <= POOL_SIZE, f"{sampled.peak} connections, pool {POOL_SIZE}"


@pytest.mark.slow
def test_eight_workers_stay_within_the_documented_bound(cluster, tmp_path):
    storage = f"postgresql+psycopg2://postgres@127.0.0.1:{cluster}/optuna"
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", storage.replace("/optuna", "/mlflow"),
                               "--artifacts-destination", (tmp_path / "served").as_uri(), "--serve-artifacts", "--host", "127.0.0.1",
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**hpolab_env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", server)
        env = {**hpolab_env(), "OPTUNA_STORAGE": storage, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}
        args = ["studies/digits_cnn.yaml", "name=eight", "n_trials=12", "parallel=1", "trainer.max_epochs=1", "pruner={type: none}",
                "sampler={type: random}", "log_models=none"]
        with _Sampler(cluster, every=0.2) as sampled:
            workers = [start_cli("--store", str(tmp_path / f"w{i}"), "worker", *args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for i in range(8)]
            outs = [w.communicate(timeout=900)[0] for w in workers]
        assert [w.returncode for w in workers] == [0] * 8, outs
        check = run_cli("--store", str(tmp_path / "w0"), "study", "check", "eight", env=env, check=False)
        assert check.returncode == 0, check.stdout + check.stderr  # the stores agree
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert 2 <= sampled.peak <= 8 * POOL_SIZE, f"{sampled.peak} connections to the Optuna database, bound {8 * POOL_SIZE}"
    trials = optuna.load_study(study_name="eight", storage=storage).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 12  # exactly the budget, all finished
