"""The Optuna storage: opened for a driver (heartbeats, stale-trial retries) or to read a study back;
a new trial asked without Optuna's look for a WAITING one (ask_new)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback

from hpolab.errors import StudyError, UserError
from hpolab.stores.paths import Stores, redact, sqlite_file
from hpolab.stores.preflight import OPTUNA_FIX, one_line, check_database, connect_args_for
from hpolab.stores.sqlite_wal import checkpoint_at_exit

HEARTBEAT_INTERVAL = int(os.environ.get("HPOLAB_HEARTBEAT_INTERVAL", "10"))  # seconds between heartbeats
GRACE_PERIOD = int(os.environ.get("HPOLAB_GRACE_PERIOD", str(6 * HEARTBEAT_INTERVAL)))  # then a trial is stale


# Connections one process (a worker) holds to a database server, at most: the budget lock's (held while a
# trial is asked for), the driver's own queries beside it, the heartbeat thread's, and one spare. A
# thread that finds them all busy waits for one (POOL_TIMEOUT_S) instead of opening more, so N workers
# hold at most N * POOL_SIZE connections (docs/how-to/scaling-out.md: PostgreSQL's max_connections).
POOL_SIZE = int(os.environ.get("HPOLAB_DB_POOL_SIZE", "4"))
POOL_TIMEOUT_S = 120  # a wait for a pooled connection; a query holds one for milliseconds


def engine_kwargs(url: str) -> dict:
    """SQLite waits for a writer's lock (seconds); a database server gets bounded connects, a
    liveness check of pooled connections (a long study outlives server restarts and idle timeouts) and
    a pool of at most POOL_SIZE connections (SQLAlchemy's default would open up to 15)."""
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 60}}
    return {"pool_pre_ping": True, "connect_args": connect_args_for(url), "pool_size": POOL_SIZE, "max_overflow": 0,
            "pool_timeout": POOL_TIMEOUT_S}


def make_storage(where: Stores | str, max_retries: int = 1) -> optuna.storages.BaseStorage:
    """The Optuna storage a driver writes (heartbeats, retries of stale trials) of a command's Stores,
    or of a storage URL."""
    import random

    url, db = (where.optuna_url, where.optuna_db) if isinstance(where, Stores) else (where, sqlite_file(where))

    # Optuna's INFO lines ("A new study created in RDB with name: ...") would come before the study's
    # own first line; its warnings (WARNING and up) are still printed.
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    from hpolab.stores.grpc_proxy import grpc_storage, is_grpc_url

    if is_grpc_url(url):
        return grpc_storage(url)  # the proxy's database holds the heartbeat settings; clients send none

    from sqlalchemy.exc import SQLAlchemyError

    _seed_sqlite(db)
    checkpoint_at_exit(db)
    for attempt in range(6):
        try:
            return optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs(url),
                heartbeat_interval=HEARTBEAT_INTERVAL,
                grace_period=GRACE_PERIOD,
                # A stale trial (its driver died) comes back as a WAITING copy with the same params;
                # start_trial() resumes it from the dead trial's last checkpoint.
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=max_retries),
            )
        except SQLAlchemyError as e:
            # Workers started together on an empty database race to create Optuna's tables; the
            # loser sees a duplicate-key error. Once the winner is done the schema is simply there.
            # Only that race is retried: a database that cannot be reached (or refuses us) is said
            # at once, in one line.
            check_database(url, "Optuna storage", OPTUNA_FIX)
            if attempt == 5:
                raise StudyError(f"cannot create Optuna's tables in {redact(url)}: {one_line(e)}") from None
            time.sleep(0.5 + random.random())
    raise AssertionError("unreachable")


def _seed_sqlite(db: Path | None) -> None:
    """A new embedded optuna.db starts as a copy of a migrated empty one (stores/db_templates.py)."""
    if db is None or db.exists() or not db.parent.is_dir():
        return
    from hpolab.stores.db_templates import seed_database

    seed_database(db, f"optuna-{optuna.__version__}",
                  create=lambda u: optuna.storages.RDBStorage(u).engine.dispose())


def load_study(name: str, stores: Stores) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = stores.optuna_db
    if db is not None and not db.exists():  # reading must not create an embedded DB
        raise UserError(f"no Optuna storage at {db}; run a study first, or pass --store DIR / --storage URL")
    storage = open_storage(stores.optuna_url)
    names = [s.study_name for s in storage.get_all_studies()]  # names only (summaries would read every trial)
    if name not in names:
        known = ", ".join(names) or "none"
        raise UserError(f"no study named {name!r} in {stores.optuna_shown} (studies there: {known})")
    return optuna.load_study(study_name=name, storage=storage)


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """For reading a study back: a database URL, or grpc://HOST:PORT of `hpolab storage-proxy`."""
    from hpolab.stores.grpc_proxy import grpc_storage, is_grpc_url

    return grpc_storage(url) if is_grpc_url(url) else optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))


def ask_new(study: optuna.Study, distributions: dict) -> optuna.Trial:
    """study.ask() less its look for a WAITING trial to run first, which reads every unfinished trial
    (under a trial scheduler every paused one: 20-40 ms at 36 of them). For a caller whose own read
    under the budget lock found none: a retry copy another worker queues meanwhile (it does not take
    the lock) stays WAITING for the next claim. The rest is ask()'s: a new trial, the sampler's
    before_trial and relative sampling (optuna.Trial), then the fixed distributions suggested."""
    study._thread_local.cached_all_trials = None  # (as ask: samplers read the trials afresh)
    trial = optuna.Trial(study, study._storage.create_new_trial(study._study_id))
    for name, distribution in distributions.items():
        trial._suggest(name, distribution)
    return trial
