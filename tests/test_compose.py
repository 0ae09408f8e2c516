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

import os
import re
import shlex
import shutil
import subprocess
import sys
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


def test_env_example_has_placeholders_and_no_password_is_committed():
    example = env_file(ENV_EXAMPLE)
    assert example["POSTGRES_PASSWORD"] == "change-me"
    assert "POSTGRES_PASSWORD" in COMPOSE.read_text() and "hpolab:hpolab@" not in COMPOSE.read_text()
    assert "/.env" in (ROOT / ".gitignore").read_text().splitlines()
    with pytest.raises(AssertionError, match="POSTGRES_PASSWORD"):
        load_compose({})  # without .env the file refuses to start rather than run without a password


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
    env = env_file(ENV_EXAMPLE)
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
        ml = services["mlflow"]
        paths = {v.split(":")[1]: str(tmp_path / v.split(":")[0]) for v in ml["volumes"]}
        cmd = _native(shlex.split(ml["command"]), hosts, paths)
        assert "--port" in cmd and cmd[cmd.index("--port") + 1] == "5000"
        assert ml["ports"] == ["127.0.0.1:5000:5000"]
        cmd[cmd.index("--port") + 1] = str(ml_port)
        cmd[cmd.index("--host") + 1] = "127.0.0.1"
        assert not any(pg_env["POSTGRES_PASSWORD"] in a for a in cmd), "a password on a command line is visible in ps"
        ml_env = {**hpolab_env(), **{k: _native([v], hosts, {})[0] for k, v in ml["environment"].items()}}
        exe = Path(sys.executable).with_name(cmd[0])
        server = subprocess.Popen([str(exe), *cmd[1:], "--workers", "1"], env=ml_env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        try:
            wait_for_http(f"http://127.0.0.1:{ml_port}/health", server)
            _run_workers(services["worker"], hosts, tmp_path)
        finally:
            server.terminate()
            server.wait(timeout=30)


def _run_workers(worker: dict, hosts: dict[str, str], tmp_path: Path) -> None:
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
    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("digits-cnn")
    runs = client.search_runs([exp.experiment_id], filter_string="attributes.run_name LIKE 'trial-%'")
    assert sorted(r.info.run_name for r in runs) == sorted(f"trial-{t.number}" for t in trials)
    password = env_file(ENV_EXAMPLE)["POSTGRES_PASSWORD"]
    assert not [o for o in outs if password in o], "a worker printed the database password"
