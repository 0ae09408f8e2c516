"""What every launcher shares: the stores the workers use and the command line each one runs.

Stores come from the flags, else the environment, else a `.env` file in the working directory
(OPTUNA_STORAGE, MLFLOW_TRACKING_URI, HPOLAB_STORE); MLflow's credentials from the environment, else
`.env`. Workers on several machines cannot share a SQLite store or a local MLflow store: those are
refused with the fix (a PostgreSQL --storage or a storage proxy, and an MLflow server) unless every
worker runs on one node.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from hpolab.errors import UserError
from hpolab.stores.paths import DEFAULT_STORE, Stores, redact, resolve_stores

STORE_VARS = ("OPTUNA_STORAGE", "MLFLOW_TRACKING_URI", "HPOLAB_STORE")
# Passed to workers through the scheduler's environment (never written into a script or manifest).
CREDENTIAL_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")

MULTI_NODE_FIX = (
    "workers on several nodes need shared stores: --storage postgresql+psycopg2://USER:PASSWORD@DBHOST:5432/optuna "
    "(or grpc://HOST:PORT of `hpolab storage-proxy`) and --tracking-uri http://MLFLOW_HOST:5000 (an `mlflow server`); "
    "set them as flags, in the environment (OPTUNA_STORAGE, MLFLOW_TRACKING_URI) or in .env")


def read_dotenv(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a .env file (comments, blanks and `export ` prefixes allowed; quotes stripped)."""
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def _from_env_or_dotenv(keys, cwd: Path | None) -> dict[str, str | None]:
    """Each key's value in the environment, else in ./.env (read once), else None."""
    dotenv = read_dotenv((cwd or Path.cwd()) / ".env")
    return {k: os.environ.get(k) or dotenv.get(k) for k in keys}


def launch_stores(store: str | None, storage: str | None, tracking_uri: str | None,
                  cwd: Path | None = None) -> Stores:
    """The stores workers get: flags, then the environment, then ./.env."""
    found = _from_env_or_dotenv(("HPOLAB_STORE", "OPTUNA_STORAGE", "MLFLOW_TRACKING_URI"), cwd)
    return resolve_stores(store or found["HPOLAB_STORE"], storage or found["OPTUNA_STORAGE"],
                          tracking_uri or found["MLFLOW_TRACKING_URI"])


def launch_credentials(cwd: Path | None = None) -> dict[str, str]:
    """MLflow's credential variables the workers get: the environment's, else ./.env's (as the stores)."""
    return {k: v for k, v in _from_env_or_dotenv(CREDENTIAL_VARS, cwd).items() if v}


def follow_flags(stores: Stores, cwd: Path) -> tuple[str, list[str]]:
    """The global flags that point a follow-up command (`hpolab study status`) at the workers' stores,
    and a note for each URL holding a secret: the flag reads it as "$VAR" and the note shows it redacted,
    so a printed command never holds a password."""
    flags: list[str] = []
    notes: list[str] = []
    if stores.root != (cwd / DEFAULT_STORE).resolve():
        flags += ["--store", shlex.quote(str(stores.root))]
    for flag, var, url, kind, shown in (("--storage", "OPTUNA_STORAGE", stores.optuna_url, stores.optuna_kind, stores.optuna_shown),
                                        ("--tracking-uri", "MLFLOW_TRACKING_URI", stores.tracking_uri, stores.tracking_kind,
                                         stores.tracking_shown)):
        if kind == "embedded":
            continue
        if has_secret(url):
            flags += [flag, f'"${var}"']
            notes.append(f"{var} is {shown} with its password")
        else:
            flags += [flag, shlex.quote(url)]
    return "".join(f" {f}" for f in flags), notes


def node_local(url: str) -> bool:
    """A store only processes on one machine can share safely (SQLite, a local MLflow folder)."""
    return url.startswith(("sqlite:", "file:", "/", ".")) or "://" not in url


def check_shared(stores: Stores, single_node: bool, how: str) -> None:
    """Refuse node-local stores for workers that may land on several nodes (`how`: the flag allowing it)."""
    if single_node:
        return
    local = [f"{name} {shown}" for name, url, shown in (("Optuna storage", stores.optuna_url, stores.optuna_shown),
                                                         ("MLflow tracking", stores.tracking_uri, stores.tracking_shown)) if node_local(url)]
    if local:
        raise UserError(f"{' and '.join(local)} {'is' if len(local) == 1 else 'are'} local to one machine (SQLite locks "
                        f"do not hold across nodes or network filesystems); {MULTI_NODE_FIX}; or {how}")


def has_secret(url: str) -> bool:
    return redact(url) != url


@dataclass(frozen=True)
class WorkerCommand:
    """`hpolab [--store DIR] worker SPEC [key=value ...]` as the scheduler runs it."""

    executable: list[str]
    spec: str
    overrides: tuple[str, ...]
    store: str | None = None  # a --store folder the user named (else the worker's ./mlruns)

    def argv(self) -> list[str]:
        store = ["--store", self.store] if self.store else []
        return [*self.executable, *store, "worker", self.spec, *self.overrides]

    def shell(self) -> str:
        return " ".join(shlex.quote(a) for a in self.argv())


def hpolab_executable() -> list[str]:
    """The `hpolab` of this installation (next to this Python), else `python -m hpolab.cli`."""
    script = Path(sys.executable).parent / "hpolab"
    return [str(script)] if script.exists() else [sys.executable, "-m", "hpolab.cli"]


def spec_path_for_workers(spec: str, cwd: Path) -> str:
    """The spec as workers name it: relative to the submit directory when inside it (workers start
    there), else absolute."""
    p = Path(spec)
    if not p.is_file():
        raise UserError(f"spec {spec}: no such file; give the path of a study spec YAML, e.g. studies/digits_cnn.yaml")
    full = p.resolve()
    try:
        return str(full.relative_to(cwd.resolve()))
    except ValueError:
        return str(full)


def prepare_stores(stores: Stores) -> None:
    """Create the stores' tables once, here, before N workers start together and race to migrate
    a fresh database (two processes upgrading one new MLflow SQLite DB at once fail)."""
    from hpolab.stores import mlflow_runs
    from hpolab.stores.optuna_storage import make_storage
    from hpolab.stores.paths import ensure_local

    ensure_local(stores)
    if stores.optuna_kind != "grpc":
        storage = make_storage(stores)
        getattr(getattr(storage, "engine", None), "dispose", lambda: None)()
    mlflow_runs.client_for(stores).search_experiments(max_results=1)
