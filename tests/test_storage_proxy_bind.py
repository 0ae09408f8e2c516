"""`hpolab storage-proxy` has no login and no TLS: it listens on loopback unless told, by a flag that
says so, to serve other machines without authentication."""

from __future__ import annotations

import subprocess

import optuna
import pytest

from conftest import run_cli, start_cli
from services import free_port


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "proxy.example.com"])
def test_a_non_loopback_address_is_refused_in_one_line(store, tmp_path, host):
    port = free_port()
    out = run_cli("--storage", f"sqlite:///{store / 'optuna.db'}", "storage-proxy", "--host", host, "--port", str(port),
                  cwd=tmp_path, check=False, timeout=60)
    said = (out.stdout + out.stderr).strip()
    assert out.returncode == 2, said
    assert len(said.splitlines()) == 1 and "Traceback" not in said, said
    assert f"--host {host}" in said and "--allow-unauthenticated-remote" in said, said


@pytest.mark.parametrize("host, flag", [("127.0.0.1", []), ("0.0.0.0", ["--allow-unauthenticated-remote"])])
def test_loopback_by_default_and_any_address_with_the_explicit_flag(store, tmp_path, host, flag):
    database = f"sqlite:///{store / 'optuna.db'}"
    optuna.create_study(study_name="reach", storage=database)
    port = free_port()
    proxy = start_cli("--storage", database, "storage-proxy", "--host", host, "--port", str(port), *flag, cwd=tmp_path,
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = proxy.stdout.readline()
        assert "storage proxy" in first and f"grpc://{host}:{port}" in first, first
        if flag:  # says, where the operator sees it, that anyone reaching the port can change every study
            assert "no authentication" in proxy.stdout.readline()
        from optuna.storages import GrpcStorageProxy

        client = GrpcStorageProxy(host="127.0.0.1", port=port)
        assert [s.study_name for s in optuna.get_all_study_summaries(client)] == ["reach"]
        client.close()
    finally:
        proxy.terminate()
        proxy.communicate(timeout=60)
