"""`hpolab launch k8s`: every manifest it writes validates offline, in strict mode, against the
Kubernetes JSON schemas that the kubernetes-validate package ships (its newest Kubernetes version).
No cluster runs here: what is checked is the manifests' shape, not a scheduler running them."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, hpolab_env
from hpolab.cli import main
from hpolab.launch.k8s_parts import MLFLOW_PORT
from services import free_port, wait_for_http

kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (in the test extras)")
K8S_VERSION = kv.latest_version()


def _write(tmp_path, monkeypatch, capsys, *args: str) -> dict[str, list[dict]]:
    monkeypatch.chdir(ROOT)  # the spec by its path inside the image: studies/...
    out = tmp_path / "k8s"
    code = main(["launch", "k8s", "studies/digits_cnn.yaml", "n_trials=40", *args, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    return {p.name: list(yaml.safe_load_all(p.read_text())) for p in sorted(out.glob("*.yaml"))}


def test_every_manifest_validates_strictly(tmp_path, monkeypatch, capsys):
    files = _write(tmp_path, monkeypatch, capsys, "--workers", "4", "--image", "registry.example.com/hpolab:1.0",
                   "--gpus-per-worker", "2", "--with-stores")
    assert sorted(files) == ["job.yaml", "networkpolicy.yaml", "stores.yaml"]
    kinds = []
    for docs in files.values():
        for doc in docs:
            kv.validate(doc, K8S_VERSION, strict=True)  # raises ValidationError on any unknown or wrong field
            kinds.append(doc["kind"])
    assert sorted(kinds) == sorted(["Job", "NetworkPolicy", "NetworkPolicy", "ConfigMap", "StatefulSet", "Service",
                                    "PersistentVolumeClaim", "PersistentVolumeClaim", "ConfigMap", "Deployment", "Service"])
    assert "kubectl" in capsys.readouterr().out


def test_the_strict_check_can_fail(tmp_path, monkeypatch, capsys):
    job = _write(tmp_path, monkeypatch, capsys, "--workers", "2", "--image", "hpolab:dev")["job.yaml"][0]
    job["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1  # not a field of a Container
    with pytest.raises(kv.ValidationError):
        kv.validate(job, K8S_VERSION, strict=True)


def test_indexed_job_of_workers_with_gpus_and_credentials_from_a_secret(tmp_path, monkeypatch, capsys):
    files = _write(tmp_path, monkeypatch, capsys, "--workers", "3", "--image", "hpolab:dev", "--gpus-per-worker", "1",
                   "--namespace", "team-a", "--secret", "team-a-stores")
    job = files["job.yaml"][0]
    spec = job["spec"]
    assert (spec["completionMode"], spec["parallelism"], spec["completions"]) == ("Indexed", 3, 3)
    assert job["metadata"]["namespace"] == "team-a"
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    # PID 1 is the worker itself: the pod's SIGTERM reaches it (a graceful stop, like Ctrl-C)
    assert container["command"][:4] == ["hpolab", "--store", "/work/mlruns", "worker"]
    assert container["command"][4:] == ["studies/digits_cnn.yaml", "n_trials=40"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = {e["name"]: e for e in container["env"]}
    for key in ("OPTUNA_STORAGE", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_PASSWORD"):
        assert "value" not in env[key]  # never inline
        assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "team-a-stores", "key": key,
                                                         **({"optional": True} if "PASSWORD" in key else {})}
    assert pod["terminationGracePeriodSeconds"] >= 60
    for policy in files["networkpolicy.yaml"]:
        sources = {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in policy["spec"]["ingress"][0]["from"]}
        target = policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        assert sources == ({"worker"} if target == "mlflow" else {"worker", "mlflow"})
    worker_labels = spec["template"]["metadata"]["labels"]
    assert worker_labels["app.kubernetes.io/component"] == "worker"


def test_store_servers_take_passwords_from_the_secret(tmp_path, monkeypatch, capsys):
    docs = _write(tmp_path, monkeypatch, capsys, "--workers", "1", "--image", "hpolab:dev", "--with-stores")["stores.yaml"]
    for doc in docs:
        for c in doc["spec"]["template"]["spec"]["containers"] if doc["kind"] in ("Deployment", "StatefulSet") else []:
            for e in c["env"]:  # a password, a URL with one, a key: only ever a reference to the Secret
                if any(w in e["name"] for w in ("PASSWORD", "SECRET", "STORE_URI", "USERNAME")):
                    assert "value" not in e and e["valueFrom"]["secretKeyRef"]["name"] == "hpolab-stores", e
    mlflow = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--backend-store-uri" not in mlflow["command"]  # read from the environment: not visible in `ps`
    assert mlflow["env"][0]["valueFrom"]["secretKeyRef"]["key"] == "MLFLOW_BACKEND_STORE_URI"


@pytest.mark.parametrize("args, says", [
    (["--workers", "0", "--image", "x"], "--workers 0"),
    (["--workers", "2", "--image", "x", "--namespace", "Team_A"], "--namespace 'Team_A'"),
])
def test_bad_arguments_are_one_clear_error(capsys, monkeypatch, args, says):
    monkeypatch.chdir(ROOT)
    code = main(["launch", "k8s", "studies/digits_cnn.yaml", *args])
    err = capsys.readouterr().err
    assert code == 2 and says in err and "Traceback" not in err


def test_studies_whose_names_slug_alike_get_their_own_job_and_selector(tmp_path, monkeypatch, capsys):
    """`a_b`, `a.b` and `a-b` are three studies: three Jobs, each selected by a label no other study has."""
    monkeypatch.chdir(ROOT)
    long = "x" * 90 + "_" + "y" * 9
    jobs, said = {}, {}
    for name in ("a_b", "a.b", "a-b", long, long[:-1] + "z"):
        out = tmp_path / name
        code = main(["launch", "k8s", "studies/digits_cnn.yaml", f"name={name}", "--workers", "2", "--image", "hpolab:dev",
                     "--out", str(out)])
        assert code == 0, capsys.readouterr().err
        said[name] = capsys.readouterr().out
        jobs[name] = next(yaml.safe_load_all((out / "job.yaml").read_text()))
    names = {n: j["metadata"]["name"] for n, j in jobs.items()}
    assert len(set(names.values())) == len(names), names
    selected = {n: j["spec"]["template"]["metadata"]["labels"]["hpolab.dev/study"] for n, j in jobs.items()}
    assert len(set(selected.values())) == len(selected), selected
    for name, job in jobs.items():
        kv.validate(job, K8S_VERSION, strict=True)
        assert job["metadata"]["labels"]["hpolab.dev/study"] == selected[name]
        # Indexed Job pods are named and hostnamed `<job>-<index>`: the Job's name leaves room for that.
        assert len(names[name]) <= 52 and len(selected[name]) <= 63
        assert f"-l hpolab.dev/study={selected[name]}" in said[name] and f"job/{names[name]}" in said[name]


def test_the_mlflow_server_runs_compose_login_with_generated_credentials_that_are_never_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "k8s"
    argv = ["launch", "k8s", "studies/digits_cnn.yaml", "--workers", "2", "--image", "hpolab:dev", "--with-stores", "--out", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr()
    stores_env = dict(line.split("=", 1) for line in (out / "stores.env").read_text().splitlines() if line and line[0] != "#")
    # Generated for the Secret (`kubectl create secret generic --from-env-file`), readable by its owner only, kept out of git.
    assert f"--from-env-file={out / 'stores.env'}" in said.out
    assert (out / "stores.env").stat().st_mode & 0o077 == 0 and "stores.env" in (out / ".gitignore").read_text().split()
    secret_values = [v for k, v in stores_env.items() if k.endswith(("PASSWORD", "SECRET_KEY", "OPTUNA_STORAGE", "STORE_URI"))]
    assert len(secret_values) == 5 and all(len(v) >= 32 for v in secret_values)
    manifests = "".join(p.read_text() for p in out.glob("*.yaml"))
    for value in secret_values:
        assert value not in said.out + said.err + manifests
    docs = list(yaml.safe_load_all((out / "stores.yaml").read_text()))
    for doc in docs:
        kv.validate(doc, K8S_VERSION, strict=True)

    # The MLflow Deployment runs docker-compose.yml's server command (tests/test_compose.py runs it: 401 without a login).
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["mlflow"]
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert server["command"] == shlex.split(compose["command"])
    env = {e["name"]: e for e in server["env"]}
    assert set(env) == set(compose["environment"])
    for name, key in [("MLFLOW_BACKEND_STORE_URI", "MLFLOW_BACKEND_STORE_URI"), ("MLFLOW_AUTH_ADMIN_USERNAME", "MLFLOW_TRACKING_USERNAME"),
                      ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_TRACKING_PASSWORD"),
                      ("MLFLOW_FLASK_SERVER_SECRET_KEY", "MLFLOW_FLASK_SERVER_SECRET_KEY")]:
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "hpolab-stores", "key": key} and key in stores_env
    # Its login config is compose's file, mounted where compose mounts it; its users' database on a volume of its own.
    config = next(d for d in docs if d["kind"] == "ConfigMap" and "basic_auth.ini" in d["data"])
    assert config["data"]["basic_auth.ini"] == (ROOT / "scripts" / "mlflow-basic-auth.ini").read_text()
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/etc/mlflow"]]["configMap"]["name"] == config["metadata"]["name"]
    assert env["MLFLOW_AUTH_CONFIG_PATH"]["value"] == "/etc/mlflow/basic_auth.ini"
    assert "persistentVolumeClaim" in volumes[mounts["/mlflow-auth"]] and mounts["/mlflow-auth"] != mounts["/artifacts"]
    netloc = urllib.parse.urlsplit(stores_env["MLFLOW_TRACKING_URI"]).netloc
    assert netloc in env["MLFLOW_SERVER_ALLOWED_HOSTS"]["value"].split(",")  # the workers' Host header is admitted

    # The workers log in with the same Secret's keys (required here: the server has no anonymous access).
    job = next(yaml.safe_load_all((out / "job.yaml").read_text()))
    worker_env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        assert worker_env[key]["valueFrom"]["secretKeyRef"] == {"name": "hpolab-stores", "key": key}

    # Launching again keeps the passwords the stores were created with.
    before = (out / "stores.env").read_text()
    assert main(argv) == 0
    assert (out / "stores.env").read_text() == before and "kept" in capsys.readouterr().out


@pytest.mark.slow
def test_the_k8s_mlflow_server_run_natively_answers_401_without_the_secret_credentials(tmp_path, monkeypatch, capsys, migrated_store):
    """The Deployment's container as the kubelet would run it, on loopback: env from stores.env through the
    secretKeyRefs, the ConfigMap's file and the volumes in temp folders, a SQLite copy for the backend."""
    from test_compose import _status

    monkeypatch.chdir(ROOT)
    out = tmp_path / "k8s"
    assert main(["launch", "k8s", "studies/digits_cnn.yaml", "--workers", "1", "--image", "hpolab:dev", "--with-stores",
                 "--out", str(out)]) == 0
    secret = dict(line.split("=", 1) for line in (out / "stores.env").read_text().splitlines() if line and line[0] != "#")
    docs = list(yaml.safe_load_all((out / "stores.yaml").read_text()))
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    server = pod["containers"][0]
    port = free_port()
    native = {m["mountPath"]: str(tmp_path / m["name"]) for m in server["volumeMounts"]}
    for path in native.values():
        Path(path).mkdir()
    for volume in pod["volumes"]:
        if "configMap" in volume:
            data = next(d["data"] for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"])
            for name, text in data.items():
                (tmp_path / volume["name"] / name).write_text(text.replace("////mlflow-auth/", f"///{native['/mlflow-auth']}/"))
    service = f"hpolab-mlflow:{MLFLOW_PORT}"
    env = {e["name"]: e["value"] if "value" in e else secret[e["valueFrom"]["secretKeyRef"]["key"]] for e in server["env"]}
    env = {k: v.replace("/etc/mlflow/", native["/etc/mlflow"] + "/").replace(service, f"127.0.0.1:{port}") for k, v in env.items()}
    shutil.copy(migrated_store / "mlflow.db", tmp_path / "mlflow.db")
    env["MLFLOW_BACKEND_STORE_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"  # not the cluster's PostgreSQL
    cmd = [native.get(a, a) for a in server["command"]]
    cmd[cmd.index("--host") + 1], cmd[cmd.index("--port") + 1] = "127.0.0.1", str(port)
    proc = subprocess.Popen([str(Path(sys.executable).with_name(cmd[0])), *cmd[1:], "--workers", "1"],
                            env={**hpolab_env(), **env}, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", proc)
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=1"
        assert _status(url) == 401
        assert _status(url, secret["MLFLOW_TRACKING_USERNAME"], secret["MLFLOW_TRACKING_PASSWORD"]) == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
