"""Where a study's data lives: the Optuna storage, the MLflow tracking store and local files.

Default (the laptop case): everything under ./mlruns -- optuna.db, mlflow.db, artifacts/ and
trials/ (per-trial checkpoints). `--storage` / OPTUNA_STORAGE and `--tracking-uri` /
MLFLOW_TRACKING_URI point at servers instead (the multi-host case) without changing the spec.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Stores:
    """A command's three stores, resolved once (resolve_stores): the local folder, the Optuna storage
    and the MLflow tracking store. What every layer needs of the two URLs is worked out here, once: their
    SQLite files, their redacted forms (what messages show) and what kind of store each is, so no
    layer parses or redacts a store URL again."""

    root: Path  # local folder: default stores, trial checkpoints, LR range test outputs
    optuna_url: str
    tracking_uri: str
    artifact_location: str | None  # for experiments we create; None = the tracking server decides
    optuna_db: Path | None = field(init=False)  # the Optuna storage's SQLite file (sqlite_file); None: any other
    tracking_db: Path | None = field(init=False)  # and the tracking store's
    optuna_shown: str = field(init=False)  # the URLs as messages show them (redact)
    tracking_shown: str = field(init=False)
    optuna_kind: str = field(init=False)  # "embedded" (root's own file), "sqlite", "grpc" (the storage proxy), "database"
    tracking_kind: str = field(init=False)  # "embedded", "sqlite", "server" (http/https), "database", "other" (a folder, a plugin)

    def __post_init__(self) -> None:
        optuna_default, tracking_default = default_urls(self.root)
        for name, url, default in (("optuna", self.optuna_url, optuna_default), ("tracking", self.tracking_uri, tracking_default)):
            db = sqlite_file(url)
            object.__setattr__(self, f"{name}_db", db)
            object.__setattr__(self, f"{name}_shown", redact(url))
            object.__setattr__(self, f"{name}_kind", _kind(url, default))

    @property
    def trials_dir(self) -> Path:
        return self.root / "trials"

    def trial_dir(self, study: str, trial_number: int) -> Path:
        return self.trials_dir / study / f"trial-{trial_number}"

    def describe(self) -> str:
        return f"optuna: {self.optuna_shown}\nmlflow: {self.tracking_shown}"

    def command(self, rest: str) -> str:
        """`hpolab [--store DIR] [--storage URL] [--tracking-uri URI] rest`: a command line that reads these
        stores from any working directory (passwords redacted), for the hints hpolab prints."""
        import shlex

        options = [] if self.root == Path(DEFAULT_STORE).resolve() else ["--store", str(self.root)]
        if self.optuna_kind != "embedded":
            options += ["--storage", self.optuna_shown]
        if self.tracking_kind != "embedded":
            options += ["--tracking-uri", self.tracking_shown]
        return " ".join(["hpolab", *(shlex.quote(o) for o in options), rest])


def _kind(url: str, default: str) -> str:
    scheme = url.split("://", 1)[0].lower().split("+")[0] if "://" in url else ""
    if url == default:
        return "embedded"
    if scheme == "sqlite":
        return "sqlite"
    if scheme in ("grpc", "grpcs"):
        return "grpc"
    if scheme in ("http", "https"):
        return "server"
    if scheme in ("postgresql", "mysql", "mssql", "oracle"):
        return "database"
    return "other"


# A URL in any text: its scheme, then everything up to whitespace (a URL holds none; a password holding
# one is percent-encoded).
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>\S*)")
# user:PASSWORD@ as SQLAlchemy's make_url reads it: the user has no ":" or "/", the password runs to the
# first "@", so it may hold "/", "?", "#" and ":" unencoded (an "@" must be written %40).
_SQLALCHEMY_USERINFO = re.compile(r"[^:/@]*:[^@]*@")
# Web schemes whose userinfo is a secret even without a ":" (https://TOKEN@host).
_WEB_SCHEMES = ("http", "https", "grpc", "grpcs", "ws", "wss", "databricks")
# ?password=PASSWORD / &pass=... / &token=... in query strings
_QUERY_SECRET = re.compile(r"(?P<head>[?&;](?:password|passwd|pass|pwd|secret|token|access_token|api_key|apikey)=)(?P<secret>[^&;#\s]*)", re.I)


def _userinfo_end(rest: str) -> int | None:
    """Where the userinfo of `rest` (a URL after `scheme://`) ends (the index of its "@"), read the way
    both parsers that may get the URL read it, taking the later end so neither leaves a piece in view:
    urllib (http) takes the netloc up to the first "/", "?" or "#" and its userinfo up to the netloc's
    last "@"; SQLAlchemy reads user:password up to the first "@" (_SQLALCHEMY_USERINFO)."""
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
    ends = [netloc.rindex("@")] if "@" in netloc else []
    m = _SQLALCHEMY_USERINFO.match(rest)
    if m:
        ends.append(m.end() - 1)
    return max(ends) if ends else None


def _redact_url(m: re.Match) -> str:
    scheme, rest = m["scheme"], m["rest"]
    end = _userinfo_end(rest)
    if end is not None:
        user, colon, _ = rest[:end].partition(":")
        if colon:  # user:password -> user:***
            rest = f"{user}:***{rest[end:]}"
        elif scheme.lower().split("+")[0] in _WEB_SCHEMES:  # a token alone is the credential
            rest = f"***{rest[end:]}"
        # else a database user without a password: nothing secret
    return f"{scheme}://{rest}"


def redact(text: str) -> str:
    """A URL (or any text holding URLs, such as an error message) safe to print or log: the password,
    or a web URL's whole userinfo, becomes ***.

    `postgresql://hpolab:s3/cr+t=@db:5432/optuna` -> `postgresql://hpolab:***@db:5432/optuna`;
    `https://TOKEN@mlflow.example.com` -> `https://***@mlflow.example.com`;
    `...?user=hpolab&password=s3cret` -> `...?user=hpolab&password=***`.
    """
    text = _URL.sub(_redact_url, str(text))
    return _QUERY_SECRET.sub(lambda m: f"{m['head']}***", text)


DEFAULT_STORE = "mlruns"  # the embedded store's folder, relative to the working directory


def default_urls(root: Path) -> tuple[str, str]:
    """The embedded store's (Optuna storage, MLflow tracking URI) in the folder `root`."""
    return f"sqlite:///{root / 'optuna.db'}", f"sqlite:///{root / 'mlflow.db'}"


def resolve_stores(store: str | None = None, storage: str | None = None, tracking_uri: str | None = None) -> Stores:
    root = Path(store or os.environ.get("HPOLAB_STORE") or DEFAULT_STORE).resolve()
    if root.exists() and not root.is_dir():
        from hpolab.errors import UserError

        raise UserError(f"--store {store or root}: is a file, not a folder; pass a folder (it holds optuna.db, mlflow.db and "
                        "artifacts/; it is created if it does not exist)")
    default_optuna, default_tracking = default_urls(root)
    optuna_url = storage or os.environ.get("OPTUNA_STORAGE") or default_optuna
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking
    return Stores(root=root, optuna_url=optuna_url, tracking_uri=uri, artifact_location=artifact_root(uri))


def sqlite_file(url: str) -> Path | None:
    """The database file of a `sqlite:///PATH[?QUERY]` URL, read as SQLAlchemy reads it: the path up
    to "?", percent-decoded. The query (`?timeout=30`, `?check_same_thread=false`) tunes SQLAlchemy's
    connections and names no other file, so it is dropped here; whoever opens the file for itself (the
    plain-SQL readers, read-only) ignores it. None for any other URL, for `:memory:`, and for sqlite's
    URI form (`sqlite:///file:PATH?mode=ro&uri=true`, whose "path" is itself a URI): those are opened
    only through SQLAlchemy."""
    if not url.startswith("sqlite:///"):
        return None
    from urllib.parse import parse_qs, unquote

    path, _, query = url[len("sqlite:///"):].partition("?")
    if path in ("", ":memory:") or parse_qs(query).get("uri", [""])[-1].lower() in ("true", "1"):
        return None
    return Path(unquote(path))


def artifact_root(tracking_uri: str) -> str | None:
    """Artifacts of experiments we create on a SQLite tracking DB live in `artifacts/` beside that DB
    (the store's by default). Workers that share the DB (`--tracking-uri sqlite:///shared/mlflow.db`)
    but each keep their own `--store` then share the artifacts too: a retry on one worker can fetch the
    checkpoint another uploaded. None: a tracking server decides (its --artifacts-destination)."""
    db = sqlite_file(tracking_uri)
    return (db.resolve().parent / "artifacts").as_uri() if db is not None else None


def ensure_local(stores: Stores) -> None:
    """Create the local folders the default stores need (nothing else is created)."""
    stores.root.mkdir(parents=True, exist_ok=True)
    if stores.artifact_location:
        from urllib.parse import unquote, urlparse

        Path(unquote(urlparse(stores.artifact_location).path)).mkdir(parents=True, exist_ok=True)


def server_ui_url(tracking_uri: str) -> str | None:
    """The MLflow UI of a tracking server (its address without the login: user:password in a URI must
    never reach a page or a message); None for any other store (an embedded one: `hpolab ui` serves it)."""
    from urllib.parse import urlsplit

    parts = urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = f"{host}:{parts.port}" if parts.port else host
    return f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}"
