"""`hpolab launch k8s`: every manifest it writes validates offline, in strict mode, against the
Kubernetes JSON schemas that the kubernetes-validate package ships (its newest Kubernetes version).
No cluster runs here: what is checked is the manifests' shape, not a scheduler running them."""

from __future__ import annotations

import pytest
import yaml

from conftest import ROOT
from hpolab.cli import main

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
                                    "PersistentVolumeClaim", "Deployment", "Service"])
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
    text = yaml.safe_dump_all(docs)
    assert "password" not in text.lower().replace("postgres_password", "")  # only the Secret key's name
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
