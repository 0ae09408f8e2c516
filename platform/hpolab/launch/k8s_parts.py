"""What the Kubernetes manifests share: the options, names, labels and Secret references."""

from __future__ import annotations

import hashlib
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
    """`hpolab-<slug>-<6 hex of sha256(study)>`: the slug is lossy (`a_b`, `a.b`, `A-b` all read `a-b`),
    the hash of the exact name keeps two studies' Jobs and selectors apart. At most 52 characters: an
    Indexed Job's pods are named and hostnamed `<job>-<index>` (a 63-character DNS label), and the name
    is also the `hpolab.dev/study` label value (at most 63)."""
    digest = hashlib.sha256(study.encode()).hexdigest()[:6]
    slug = re.sub(r"[^a-z0-9-]+", "-", f"hpolab-{study}".lower()).strip("-")[:45].rstrip("-")
    return f"{slug}-{digest}"


def labels(component: str, study: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "hpolab", "app.kubernetes.io/component": component, **PART_OF}
    if study:
        out["hpolab.dev/study"] = job_name(study)
    return out


def secret_env(secret: str, key: str, optional: bool = False, name: str | None = None) -> dict[str, Any]:
    """Env var `name` (default: the key's own name) from the Secret's `key`."""
    ref: dict[str, Any] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name or key, "valueFrom": {"secretKeyRef": ref}}
