"""What the Kubernetes manifests share: the options, names, labels and Secret references."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
PART_OF = {"app.kubernetes.io/part-of": "hpolab"}
STORE_KEYS = ("OPTUNA_STORAGE", "MLFLOW_TRACKING_URI")
OPTIONAL_KEYS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
MLFLOW_PORT, POSTGRES_PORT = 5000, 5432


@dataclass(frozen=True)
class K8sOptions:
    workers: int
    image: str
    gpus_per_worker: int = 0
    namespace: str = "hpolab"
    secret: str = "hpolab-stores"
    with_stores: bool = False
    cpus_per_worker: int = 2
    grace_seconds: int = 300  # SIGTERM -> SIGKILL: time for running trials to end their epoch


def job_name(study: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", f"hpolab-{study}".lower()).strip("-")[:52].rstrip("-")
    return name or "hpolab-worker"


def labels(component: str, study: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "hpolab", "app.kubernetes.io/component": component, **PART_OF}
    if study:
        out["hpolab.dev/study"] = job_name(study)
    return out


def secret_env(secret: str, key: str, optional: bool = False) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": key, "valueFrom": {"secretKeyRef": ref}}
