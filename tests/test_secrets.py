"""Passwords and tokens in store URLs never reach stdout, stderr, files hpolab writes or MLflow records.

Real users' URLs: base64-style passwords (`+`, `=`, `/`), passwords holding `?`, `#`, `:` (SQLAlchemy
reads a password up to the first `@`, so these may stand unencoded) or a percent-encoded `@`, a token
alone as an https URI's userinfo, user:password in an https URI, and `?password=` in a query string.
Each goes through the commands that print or keep a URL: `study run` and `study status` against a
store that does not answer (a closed loopback port), and `launch slurm --dry-run`. The slow test runs
a study that reaches a PostgreSQL whose user has such a password, submits it to a real Slurm, and
greps every output, file and MLflow record.
"""

from __future__ import annotations

import re
import subprocess
import urllib.parse

import pytest
from sqlalchemy.engine import make_url

from conftest import FAULT_PROJECT, FAULT_SPEC, ROOT, hpolab_env, run_cli
from hpolab.stores.paths import redact
from services import HAVE_POSTGRES, NO_POSTGRES, free_port, postgres_cluster

SPEC = str(ROOT / "studies" / "digits_cnn.yaml")


def _shapes(port: int) -> list[tuple[str, str, list[str]]]:
    """(flag, URL, secrets that must not show): each secret as written and as the parser decodes it."""
    db = f"127.0.0.1:{port}/optuna"
    return [
        ("--storage", f"postgresql+psycopg2://hpolab:Sl4sh/pw7@{db}", ["Sl4sh/pw7"]),
        ("--storage", f"postgresql+psycopg2://hpolab:Qm?Hs#Co:lon@{db}", ["Qm?Hs#Co:lon", "Hs#Co"]),
        ("--storage", f"postgresql+psycopg2://hpolab:At%40Sign%2Fenc@{db}", ["At%40Sign", "At@Sign", "Sign/enc"]),
        ("--storage", f"postgresql+psycopg2://hpolab:c2VjcmV0+Yi/4==@{db}", ["c2VjcmV0", "Yi/4=="]),
        ("--storage", f"postgresql+psycopg2://{db}?user=hpolab&password=QuerySecret9", ["QuerySecret9"]),
        # a port out of range: said at once (a proxy that does not answer is waited for 10 s)
        ("--storage", f"grpc://hpolab:GrpcPw77@127.0.0.1:{port}99", ["GrpcPw77"]),
        ("--tracking-uri", f"https://TokenOnly0123abc@127.0.0.1:{port}", ["TokenOnly0123abc"]),
        ("--tracking-uri", f"https://alice:PassWord42@127.0.0.1:{port}", ["PassWord42"]),
    ]


def _password_of(url: str) -> str | None:
    """The secret as the library that opens the URL reads it (SQLAlchemy, or urllib for http)."""
    if url.startswith("http"):
        parts = urllib.parse.urlsplit(url)
        return parts.password or parts.username
    u = make_url(url)
    return u.password or u.query.get("password")


def _assert_hidden(text: str, secrets: list[str], where: str) -> None:
    for s in secrets:
        assert s not in text, f"{s!r} shows in {where}:\n{text}"


@pytest.mark.parametrize("flag, url, secrets", _shapes(5432))
def test_redact_hides_what_the_parsers_read_as_the_secret(flag, url, secrets):
    secret = _password_of(url)
    assert secret, url  # the parser does see a secret in this URL
    for text in (url, f"cannot reach the store '{url}' (connection refused)", f"url={url}\nnext line"):
        shown = redact(text)
        _assert_hidden(shown, [secret, urllib.parse.quote(secret, safe=""), *secrets], "redact()")
        assert "127.0.0.1:5432" in shown and "***" in shown  # the host stays, to debug with


def test_urls_without_a_secret_are_left_as_they_are():
    for url in ("sqlite:////tmp/a:b@c/optuna.db", "http://127.0.0.1:5000/x", "postgresql+psycopg2://hpolab@db/optuna",
                "grpc://proxy:13000", "file:///tmp/mlruns"):
        assert redact(url) == url


@pytest.mark.parametrize("error", ["UserError", "StudyError"])
def test_the_cli_redacts_any_error_it_prints(monkeypatch, capsys, error):
    # The last line of defence: an error whose text quotes a store URL verbatim (a library's message,
    # passed on as it came) is still printed without its password.
    import hpolab.cli as cli
    import hpolab.errors as errors

    def failing(args):
        raise getattr(errors, error)("cannot reach postgresql+psycopg2://u:Sl4sh/pw==@db:5432/optuna")

    monkeypatch.setattr(cli, "cmd_env", failing)
    code = cli.main(["env"])
    err = capsys.readouterr().err
    assert code == (errors.EXIT_BAD_INPUT if error == "UserError" else errors.EXIT_FAILED)
    assert "Sl4sh/pw==" not in err and "u:***@db:5432" in err


@pytest.mark.slow
def test_no_command_shows_a_secret(tmp_path):
    """Through the real CLI: `study run` and `study status` against a store that does not answer,
    and the script of `launch slurm --dry-run`."""
    port = free_port()  # bound and released: nothing listens there
    for flag, url, secrets in _shapes(port):
        secrets = [*secrets, _password_of(url)]
        runs = [("study", "run", SPEC, "n_trials=1"), ("study", "status", "digits-cnn"),
                ("launch", "slurm", SPEC, "--workers", "2", "--single-node", "--dry-run")]
        for args in runs:
            out = run_cli("--store", str(tmp_path / "st"), flag, url, *args, cwd=tmp_path, check=False)
            _assert_hidden(out.stdout + out.stderr, secrets, f"hpolab {flag} {url} {' '.join(args)}")
            assert "Traceback" not in out.stderr
            if args[0] == "launch":
                assert out.returncode == 0, out.stderr
                subprocess.run(["bash", "-n"], input=out.stdout, text=True, check=True)
            else:
                assert out.returncode in (1, 2) and "***" in out.stderr, out.stderr
    _assert_hidden("".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()),
                   [s for _, _, ss in _shapes(port) for s in ss], "the files written")


# One PostgreSQL password of every awkward shape: base64's "/", "+" and "=", and "?", "#", ":" unencoded,
# "@" percent-encoded (SQLAlchemy reads the password up to the first raw "@").
PG_PASSWORD = "c2Vj/Qm?Hs#:+x==@1"
PG_IN_URL = PG_PASSWORD.replace("@", "%40")
PG_SECRETS = [PG_PASSWORD, PG_IN_URL, "c2Vj/Qm", "Hs#:+x=="]


def _everything_written(*folders) -> str:
    """Every file under `folders`, databases included, as text (bytes that are not UTF-8 replaced)."""
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for d in folders for p in d.rglob("*") if p.is_file())


def _mlflow_records(store) -> str:
    """Every param and tag of every run in the store's MLflow DB."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs
    return "\n".join(f"{k}={v}" for r in runs for k, v in (*r.data.params.items(), *r.data.tags.items()))


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_POSTGRES, reason=NO_POSTGRES)
def test_a_study_on_a_database_with_such_a_password_shows_and_keeps_none_of_it(store, tmp_path):
    with postgres_cluster(user="hpolab", password=PG_PASSWORD) as (_, port, _data):
        url = f"postgresql+psycopg2://hpolab:{PG_IN_URL}@127.0.0.1:{port}/postgres"
        env = {**hpolab_env(), "OPTUNA_STORAGE": url}
        outs = [run_cli("--store", str(store), "study", "run", FAULT_SPEC, "name=secret-pg", "n_trials=1",
                        "trainer.max_epochs=1", cwd=FAULT_PROJECT, env=env, timeout=300),
                run_cli("--store", str(store), "study", "status", "secret-pg", cwd=FAULT_PROJECT, env=env),
                run_cli("--store", str(store), "study", "list", cwd=FAULT_PROJECT, env=env)]
        assert "secret-pg" in outs[-1].stdout  # it did reach the database
        wrong = url.replace(PG_IN_URL, PG_IN_URL + "x")
        outs.append(run_cli("--store", str(store), "--storage", wrong, "study", "status", "secret-pg",
                            cwd=FAULT_PROJECT, check=False))
        assert outs[-1].returncode == 2 and "password authentication failed" in outs[-1].stderr
    _assert_hidden("\n".join(o.stdout + o.stderr for o in outs), PG_SECRETS, "the commands' output")
    _assert_hidden(_everything_written(store, tmp_path), PG_SECRETS, "the files written")
    _assert_hidden(_mlflow_records(store), PG_SECRETS, "MLflow params and tags")
