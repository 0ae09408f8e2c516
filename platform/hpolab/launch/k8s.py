"""`hpolab launch k8s`: Kubernetes manifests for N workers of a study (written, never applied).

    job.yaml            an Indexed Job: `parallelism` = `completions` = N pods, each `hpolab worker SPEC ...`;
                        GPUs as nvidia.com/gpu limits; the stores' URLs (and MLflow credentials) from a
                        Secret through env valueFrom.secretKeyRef, never inline; the pod and node names
                        through the downward API (recorded as env.k8s_* tags on every trial run)
    networkpolicy.yaml  the stores (pods labelled app.kubernetes.io/component: postgres | mlflow) admit
                        only the workers (PostgreSQL also the MLflow server) on their one port
    stores.yaml         with --with-stores: a PostgreSQL StatefulSet and an MLflow server Deployment (with
                        its basic-auth login) with their Services and volumes, for a cluster that has none
                        (passwords from the Secret, whose values it generates into stores.env: k8s_secret.py)

Kubernetes stops a pod with SIGTERM to PID 1 (the worker: the image's command is `hpolab` itself), so
an evicted or deleted worker stops gracefully like Ctrl-C; terminationGracePeriodSeconds gives a
running epoch time to end before SIGKILL. The Job's other pods and the next launch resume its trials.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hpolab.errors import UserError
from hpolab.launch.k8s_parts import (DNS_LABEL, MLFLOW_PORT, OPTIONAL_KEYS, PART_OF, POSTGRES_PORT, STORE_KEYS, K8sOptions,
                                     job_name, labels, secret_env)
from hpolab.launch.workers import WorkerCommand


def check_options(o: K8sOptions) -> None:
    if o.workers < 1:
        raise UserError(f"--workers {o.workers}: give 1 or more (one pod per worker)")
    if o.gpus_per_worker < 0:
        raise UserError(f"--gpus-per-worker {o.gpus_per_worker}: give 0 or more")
    for flag, value in (("--namespace", o.namespace), ("--secret", o.secret)):
        if not DNS_LABEL.match(value):
            raise UserError(f"{flag} {value!r}: a Kubernetes name is lower-case letters, digits and '-', at most 63")
    if not o.image or any(c.isspace() for c in o.image):
        raise UserError(f"--image {o.image!r}: give an image reference, e.g. registry.example.com/hpolab:1.0")


def _worker_env(o: K8sOptions) -> list[dict[str, Any]]:
    # The credentials are optional for a server without a login; --with-stores' server has one.
    return [*[secret_env(o.secret, k) for k in STORE_KEYS],
            *[secret_env(o.secret, k, optional=not o.with_stores) for k in OPTIONAL_KEYS],
            {"name": "HPOLAB_K8S_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "HPOLAB_K8S_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "PYTHONUNBUFFERED", "value": "1"}]


def _worker_container(command: WorkerCommand, o: K8sOptions) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": str(o.cpus_per_worker), "memory": "4Gi"},
                                 "limits": {"memory": "16Gi"}}
    if o.gpus_per_worker:
        resources["limits"]["nvidia.com/gpu"] = str(o.gpus_per_worker)  # extended resources: limits (= requests)
    return {
        "name": "worker", "image": o.image, "command": command.argv(), "workingDir": "/app",
        "env": _worker_env(o), "resources": resources,
        "volumeMounts": [{"name": "local-store", "mountPath": "/work/mlruns"}, {"name": "shm", "mountPath": "/dev/shm"}],
        "securityContext": {"allowPrivilegeEscalation": False},
    }


def job_manifest(study: str, command: WorkerCommand, o: K8sOptions) -> dict[str, Any]:
    """The Indexed Job: N pods at once, each one `hpolab worker` (they share the study's budget)."""
    pod_spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": o.grace_seconds,
        "containers": [_worker_container(command, o)],
        "volumes": [{"name": "local-store", "emptyDir": {}},  # trial checkpoints; uploads go to MLflow
                    {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}],  # DataLoader workers
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job_name(study), "namespace": o.namespace, "labels": labels("worker", study)},
        "spec": {
            "completionMode": "Indexed", "completions": o.workers, "parallelism": o.workers,
            "backoffLimit": 2 * o.workers,  # a pod that failed (node lost, OOM) is replaced; it rejoins the study
            "template": {"metadata": {"labels": labels("worker", study)}, "spec": pod_spec},
        },
    }


def _admit(component: str, port: int, sources: list[str], namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": f"hpolab-{component}-ingress", "namespace": namespace, "labels": labels(component)},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/component": component, **PART_OF}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/component": s, **PART_OF}}}
                                  for s in sources],
                         "ports": [{"protocol": "TCP", "port": port}]}],
        },
    }


def network_policies(o: K8sOptions) -> list[dict[str, Any]]:
    """Only the workers reach MLflow; only the workers and MLflow reach PostgreSQL."""
    return [_admit("mlflow", MLFLOW_PORT, ["worker"], o.namespace),
            _admit("postgres", POSTGRES_PORT, ["worker", "mlflow"], o.namespace)]


def write_manifests(out: Path, study: str, command: WorkerCommand, o: K8sOptions) -> list[Path]:
    from hpolab.launch.k8s_stores import store_manifests

    out.mkdir(parents=True, exist_ok=True)
    files = {"job.yaml": [job_manifest(study, command, o)], "networkpolicy.yaml": network_policies(o)}
    if o.with_stores:
        files["stores.yaml"] = store_manifests(o)
    paths = []
    for name, docs in files.items():
        path = out / name
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        paths.append(path)
    return paths


def _secret_step(o: K8sOptions, secret: tuple[Path, bool] | None) -> list[str]:
    create = f"kubectl -n {o.namespace} create secret generic {o.secret} --from-env-file="
    if secret is None:
        return [f"1. the stores' URLs go in Secret {o.secret} (keys {', '.join(STORE_KEYS)}; MLFLOW_TRACKING_USERNAME/PASSWORD",
                "   if the MLflow server has a login), from a file, not a command line:",
                f"   {create}stores.env"]
    path, new = secret
    said = "wrote it with generated passwords" if new else "kept it: the stores were created with its passwords"
    return [f"1. the Secret {o.secret}: {path} ({said}; mode 600, ignored by git; keep it private):",
            f"   {create}{path}"]


def next_steps(paths: list[Path], study: str, o: K8sOptions, secret: tuple[Path, bool] | None = None) -> str:
    """What to do with the manifests. secret: (the stores.env written for --with-stores, whether it is new)."""
    return "\n".join([
        f"wrote {', '.join(str(p) for p in paths)}",
        *_secret_step(o, secret),
        f"2. kubectl create namespace {o.namespace}  (once), then: kubectl apply -f {paths[0].parent}",
        f"3. follow: kubectl -n {o.namespace} get pods -l hpolab.dev/study={job_name(study)}; "
        f"kubectl -n {o.namespace} logs -f job/{job_name(study)}; hpolab study status {study} (with the same stores)",
        f"stop: kubectl -n {o.namespace} delete job {job_name(study)}  (SIGTERM: trials end as interrupted; apply again to continue)",
    ])
