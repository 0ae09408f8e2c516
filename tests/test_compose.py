"""docker-compose.yml stays true: validated by Docker's own parser, and its services run natively.

There is no Docker engine here, so the file is brought up as far as a machine without one can:
`docker-compose config -q` (Debian's package) validates it, and the test below reads the file and runs
each service's own command and environment on loopback -- the postgres service's environment and init
script -> a real PostgreSQL with password logins, the mlflow service's command -> a real `mlflow server`,
the worker service's command and environment -> two real workers. Compose hostnames (`postgres`,
`mlflow`) map to 127.0.0.1 on free ports; container paths of volumes map to temp folders. A wrong
command, variable, port or path in the file fails here.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient
from optuna.trial import TrialState

from conftest import ROOT, hpolab_env, start_cli
from services import HAVE_POSTGRES, NO_POSTGRES, as_postgres, free_port, postgres_cluster, wait_for_http

COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
VAR = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?message} forms."""
    def sub(m: re.Match) -> str:
        name, op, arg = m.groups()
        value = env.get(name)
        if value:
            return value
        if op == "-":
            return arg
        if op == "?":
            raise AssertionError(f"compose needs {name}: {arg}")
        return ""
    return VAR.sub(sub, text)


def load_compose(env: dict[str, str]) -> dict:
    return yaml.safe_load(interpolate(COMPOSE.read_text(), env))


def generated_env(tmp_path: Path) -> dict[str, str]:
    """What `scripts/make-env` writes for a user (random passwords), read back as compose reads .env."""
    path = tmp_path / ".env"
    made = subprocess.run([str(ROOT / "scripts" / "make-env"), str(path)], capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    return env_file(path)


def test_env_is_generated_with_random_passwords_and_never_committed(tmp_path):
    example = env_file(ENV_EXAMPLE)
    assert example["POSTGRES_PASSWORD"] == "change-me" and example["MLFLOW_TRACKING_PASSWORD"] == "change-me"
    assert "POSTGRES_PASSWORD" in COMPOSE.read_text() and "hpolab:hpolab@" not in COMPOSE.read_text()
    assert "/.env" in (ROOT / ".gitignore").read_text().splitlines()
    made = generated_env(tmp_path)
    (tmp_path / "again").mkdir()
    other = generated_env(tmp_path / "again")
    assert set(made) == set(other) == set(example)
    for key in ("POSTGRES_PASSWORD", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert len(made[key]) >= 32 and made[key] != example[key] and made[key] != other[key]
    assert (tmp_path / ".env").stat().st_mode & 0o077 == 0  # only its owner reads the passwords
    again = subprocess.run([str(ROOT / "scripts" / "make-env"), str(tmp_path / ".env")], capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr and env_file(tmp_path / ".env") == made  # never replaced
    for missing in ("POSTGRES_PASSWORD", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        with pytest.raises(AssertionError, match=missing):
            load_compose({k: v for k, v in made.items() if k != missing})  # without .env compose refuses to start


def test_the_mlflow_server_needs_a_login_and_only_loopback_reaches_its_port(tmp_path):
    services = load_compose(generated_env(tmp_path))["services"]
    ml, worker = services["mlflow"], services["worker"]
    cmd = shlex.split(ml["command"])
    assert cmd[cmd.index("--app-name") + 1] == "basic-auth"
    assert ml["ports"] == ["127.0.0.1:5000:5000"]  # published on this host's loopback only
    assert not [s for s in services.values() if any(not p.startswith("127.0.0.1:") for p in s.get("ports", []))]
    # The workers log in as the admin the server creates, and reach it by a Host header it admits.
    assert worker["environment"]["MLFLOW_TRACKING_USERNAME"] == ml["environment"]["MLFLOW_AUTH_ADMIN_USERNAME"]
    assert worker["environment"]["MLFLOW_TRACKING_PASSWORD"] == ml["environment"]["MLFLOW_AUTH_ADMIN_PASSWORD"]
    netloc = urllib.parse.urlsplit(worker["environment"]["MLFLOW_TRACKING_URI"]).netloc
    assert netloc in ml["environment"]["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")


@pytest.mark.slow
def test_the_mlflow_service_answers_401_without_credentials_and_200_with_the_generated_ones(tmp_path, migrated_store):
    env = generated_env(tmp_path)
    ml = load_compose(env)["services"]["mlflow"]
    ml_port = free_port()
    shutil.copy(migrated_store / "mlflow.db", tmp_path / "mlflow.db")  # the service's own command; SQLite, not PostgreSQL
    backend = {"MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    server = _start_mlflow(ml, {"mlflow:5000": f"127.0.0.1:{ml_port}"}, ml_port, tmp_path, backend)
    try:
        url = f"http://127.0.0.1:{ml_port}/api/2.0/mlflow/experiments/search?max_results=1"
        assert _status(url) == 401
        assert _status(url, env["MLFLOW_TRACKING_USERNAME"], "wrong-password-123") == 401
        assert _status(url, env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"]) == 200
        # README's recipe for more users: the admin creates one, who then logs in.
        from mlflow.server import get_app_client

        os.environ.update({k: env[k] for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")})
        try:
            get_app_client("basic-auth", tracking_uri=f"http://127.0.0.1:{ml_port}").create_user("alice", "alice-password-123")
        finally:
            os.environ.pop("MLFLOW_TRACKING_USERNAME", None)
            os.environ.pop("MLFLOW_TRACKING_PASSWORD", None)
        assert _status(url, "alice", "alice-password-123") == 200
    finally:
        server.terminate()
        server.wait(timeout=30)


def _status(url: str, user: str | None = None, password: str | None = None) -> int:
    req = urllib.request.Request(url)
    if user:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="Debian's docker-compose not installed (run scripts/system-deps)")
def test_docker_compose_validates_the_file():
    ok = subprocess.run(["docker-compose", "--env-file", str(ENV_EXAMPLE), "config", "-q"], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    resolved = subprocess.run(["docker-compose", "--env-file", str(ENV_EXAMPLE), "config"], cwd=ROOT, capture_output=True, text=True, check=True)
    ours = load_compose(env_file(ENV_EXAMPLE))["services"]
    theirs = yaml.safe_load(resolved.stdout)["services"]
    # Our reading of the file (used below to run it) agrees with Docker's on what each service runs.
    for name in ("mlflow", "worker"):
        theirs_cmd = theirs[name]["command"]  # compose v1 keeps a string, v2 a list
        assert shlex.split(ours[name]["command"]) == (shlex.split(theirs_cmd) if isinstance(theirs_cmd, str) else theirs_cmd)
        assert ours[name]["environment"] == theirs[name]["environment"]
    assert ours["postgres"]["environment"] == theirs["postgres"]["environment"]


def _native(args: list[str], hosts: dict[str, str], paths: dict[str, str]) -> list[str]:
    out = []
    for a in args:
        a = paths.get(a, a)
        for host, addr in hosts.items():
            a = a.replace(host, addr)
        out.append(a)
    return out


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_POSTGRES, reason=NO_POSTGRES)
def test_compose_services_run_natively_on_loopback(tmp_path):
    env = generated_env(tmp_path)
    services = load_compose(env)["services"]

    # postgres: the image's contract -- POSTGRES_USER/PASSWORD/DB, then the init scripts it mounts.
    pg_env = services["postgres"]["environment"]
    init_sql = [v.split(":")[0] for v in services["postgres"]["volumes"] if "docker-entrypoint-initdb.d" in v]
    with postgres_cluster(user=pg_env["POSTGRES_USER"], password=pg_env["POSTGRES_PASSWORD"]) as (bin_dir, pg_port, _):
        host = ["-h", "127.0.0.1", "-p", str(pg_port), "-U", pg_env["POSTGRES_USER"]]
        as_postgres(str(bin_dir / "createdb"), *host, pg_env["POSTGRES_DB"], env={**os.environ, "PGPASSWORD": pg_env["POSTGRES_PASSWORD"]})
        for sql in init_sql:
            as_postgres(str(bin_dir / "psql"), *host, "-d", pg_env["POSTGRES_DB"], "-v", "ON_ERROR_STOP=1",
                        "-c", (ROOT / sql).read_text(), env={**os.environ, "PGPASSWORD": pg_env["POSTGRES_PASSWORD"]})

        # mlflow: its command and environment, with the compose hostnames and ports on loopback.
        ml_port = free_port()
        hosts = {"postgres:5432": f"127.0.0.1:{pg_port}", "mlflow:5000": f"127.0.0.1:{ml_port}"}
        server = _start_mlflow(services["mlflow"], hosts, ml_port, tmp_path)
        try:
            _run_workers(services["worker"], hosts, tmp_path, env)
        finally:
            server.terminate()
            server.wait(timeout=30)


def _volumes(service: dict, tmp_path: Path) -> dict[str, str]:
    """Container path -> native path: a named volume is a temp folder; a bind-mounted file is a copy
    of the repository's file with the named volumes' container paths pointing at those folders."""
    named, files = {}, {}
    for v in service["volumes"]:
        src, dst = v.split(":")[:2]
        if src.startswith("./"):
            files[dst] = ROOT / src
        else:
            named[dst] = str(tmp_path / src)
            (tmp_path / src).mkdir(exist_ok=True)
    paths = dict(named)
    for dst, src in files.items():
        text = src.read_text()
        for container, native in named.items():
            text = text.replace(container + "/", native + "/")
        copy = tmp_path / Path(dst).name
        copy.write_text(text)
        paths[dst] = str(copy)
    return paths


def _start_mlflow(ml: dict, hosts: dict[str, str], ml_port: int, tmp_path: Path,
                  override: dict[str, str] | None = None) -> subprocess.Popen:
    """The mlflow service's command and environment, natively: hostnames and volumes mapped, port ml_port."""
    paths = _volumes(ml, tmp_path)
    cmd = _native(shlex.split(ml["command"]), hosts, paths)
    assert "--port" in cmd and cmd[cmd.index("--port") + 1] == "5000"
    assert ml["ports"] == ["127.0.0.1:5000:5000"]
    cmd[cmd.index("--port") + 1] = str(ml_port)
    cmd[cmd.index("--host") + 1] = "127.0.0.1"
    secrets = [v for k, v in ml["environment"].items() if any(w in k for w in ("PASSWORD", "SECRET", "URI"))]
    assert not any(s in a for s in secrets for a in cmd), "a password on a command line is visible in ps"
    ml_env = {**hpolab_env(), **{k: _native([v], hosts, paths)[0] for k, v in ml["environment"].items()}, **(override or {})}
    exe = Path(sys.executable).with_name(cmd[0])
    server = subprocess.Popen([str(exe), *cmd[1:], "--workers", "1"], env=ml_env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for_http(f"http://127.0.0.1:{ml_port}/health", server)  # the one route basic-auth leaves open
    except BaseException:
        server.kill()
        raise
    return server


def _run_workers(worker: dict, hosts: dict[str, str], tmp_path: Path, dotenv: dict[str, str]) -> None:
    # Two replicas (`docker compose up --scale worker=2 worker`), each with its own local store (its
    # container's filesystem). The study is shortened with key=value overrides appended to the command.
    cmd = shlex.split(worker["command"]) + ["n_trials=3", "parallel=1", "trainer.max_epochs=1", "pruner={type: none}",
                                            "log_models=none"]
    assert cmd[:2] == ["hpolab", "worker"] and (ROOT / cmd[2]).is_file()
    for v in worker["volumes"]:
        src, dst = v.split(":")[:2]
        assert (ROOT / src).is_dir() and dst.startswith("/app/"), v  # the Dockerfile's WORKDIR is /app
    env = {k: _native([v], hosts, {})[0] for k, v in worker["environment"].items()}
    procs = [
        start_cli(*cmd[1:], cwd=ROOT, env={**hpolab_env(), **env, "HPOLAB_STORE": str(tmp_path / f"worker{i}")},
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    study = optuna.load_study(study_name="digits-cnn", storage=env["OPTUNA_STORAGE"])
    trials = study.get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert len([t for t in trials if t.state == TrialState.COMPLETE]) >= 3
    os.environ.update({k: env[k] for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")})  # as the workers log in
    try:
        client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
        exp = client.get_experiment_by_name("digits-cnn")
        runs = client.search_runs([exp.experiment_id], filter_string="attributes.run_name LIKE 'trial-%'")
    finally:
        os.environ.pop("MLFLOW_TRACKING_USERNAME", None)
        os.environ.pop("MLFLOW_TRACKING_PASSWORD", None)
    assert sorted(r.info.run_name for r in runs) == sorted(f"trial-{t.number}" for t in trials)
    for key in ("POSTGRES_PASSWORD", "MLFLOW_TRACKING_PASSWORD"):
        assert not [o for o in outs if dotenv[key] in o], f"a worker printed {key}"
