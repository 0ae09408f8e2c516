"""`hpolab launch k8s --with-stores`: a PostgreSQL and an MLflow server for a cluster that has none.

The same topology as docker-compose.yml: PostgreSQL holds the `optuna` and `mlflow` databases; the
MLflow server (the hpolab image has mlflow) keeps artifacts on its own volume and serves them. Its
passwords come from the Secret: POSTGRES_PASSWORD, and MLFLOW_BACKEND_STORE_URI, which mlflow reads
from its environment (never a command-line argument, where `ps` would show it). Both listen on all
of their pod's interfaces, which is what a Service needs; networkpolicy.yaml admits only the workers
(and MLflow to PostgreSQL). MLflow runs docker-compose.yml's server command: its basic-auth login with
compose's config (scripts/mlflow-basic-auth.ini, here a ConfigMap), the first admin and the CSRF key
from the Secret (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, as whom the workers log in, and
MLFLOW_FLASK_SERVER_SECRET_KEY), its users' database on a volume of its own. Basic auth sends the
password with every request: expose it beyond the cluster only behind TLS (an Ingress with a certificate).
"""

from __future__ import annotations

from typing import Any

from hpolab.launch.k8s_parts import MLFLOW_PORT, POSTGRES_PORT, K8sOptions, labels, secret_env

POSTGRES_IMAGE = "postgres:16"
# scripts/mlflow-basic-auth.ini, which docker-compose.yml mounts (tests/test_launch_k8s.py keeps them equal)
AUTH_INI = """\
# The MLflow server's login (`mlflow server --app-name basic-auth`, MLFLOW_AUTH_CONFIG_PATH names this
# file), as docker-compose.yml and `hpolab launch k8s --with-stores` run it (the same text).
# The first admin's name and password come from the environment (MLFLOW_AUTH_ADMIN_USERNAME /
# MLFLOW_AUTH_ADMIN_PASSWORD, from .env or the Secret), never from this file.
[mlflow]
# Every user may read every experiment; writing to one takes EDIT on it (its creator has MANAGE).
default_permission = READ
# The users' database: SQLite on a volume of its own (not the artifacts volume, which the server serves).
database_uri = sqlite:////mlflow-auth/basic_auth.db
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
# A worker makes hundreds of requests per study: check each password's hash once per 5 minutes, not
# on every request (a password change reaches the other server processes within that time).
auth_cache_ttl_seconds = 300
"""
INIT_SQL = "-- the MLflow tracking database next to Optuna's (the image creates POSTGRES_DB itself)\nCREATE DATABASE mlflow;\n"


def _service(component: str, port: int, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"hpolab-{component}", "namespace": namespace, "labels": labels(component)},
            "spec": {"selector": {"app.kubernetes.io/component": component, "app.kubernetes.io/part-of": "hpolab"},
                     "ports": [{"name": component, "port": port, "targetPort": port, "protocol": "TCP"}]}}


def _postgres(o: K8sOptions) -> list[dict[str, Any]]:
    init = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "hpolab-postgres-init", "namespace": o.namespace, "labels": labels("postgres")},
            "data": {"mlflow.sql": INIT_SQL}}
    container = {
        "name": "postgres", "image": POSTGRES_IMAGE,
        "env": [{"name": "POSTGRES_USER", "value": "hpolab"}, {"name": "POSTGRES_DB", "value": "optuna"},
                secret_env(o.secret, "POSTGRES_PASSWORD"), {"name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata"}],
        "ports": [{"containerPort": POSTGRES_PORT, "name": "postgres"}],
        "readinessProbe": {"exec": {"command": ["pg_isready", "-U", "hpolab"]}, "periodSeconds": 5},
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"},
                         {"name": "init", "mountPath": "/docker-entrypoint-initdb.d"}],
    }
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "hpolab-postgres", "namespace": o.namespace, "labels": labels("postgres")},
        "spec": {
            "serviceName": "hpolab-postgres", "replicas": 1,
            "selector": {"matchLabels": labels("postgres")},
            "template": {"metadata": {"labels": labels("postgres")},
                         "spec": {"containers": [container],
                                  "volumes": [{"name": "init", "configMap": {"name": "hpolab-postgres-init"}}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                                      "spec": {"accessModes": ["ReadWriteOnce"],
                                               "resources": {"requests": {"storage": "10Gi"}}}}],
        },
    }
    return [init, statefulset, _service("postgres", POSTGRES_PORT, o.namespace)]


def _claim(name: str, size: str, o: K8sOptions) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": o.namespace, "labels": labels("mlflow")},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}


def _mlflow_env(o: K8sOptions) -> list[dict[str, Any]]:
    service = f"hpolab-mlflow:{MLFLOW_PORT}"
    hosts = [service, *(f"hpolab-mlflow.{o.namespace}{d}:{MLFLOW_PORT}" for d in ("", ".svc", ".svc.cluster.local"))]
    return [
        secret_env(o.secret, "MLFLOW_BACKEND_STORE_URI"),
        # MLflow's job runner (GenAI scorers, trace rollups): more processes and CPU, nothing hpolab uses
        {"name": "MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "value": "false"},
        # The login: its config, its first admin (the workers' credentials), its CSRF key
        {"name": "MLFLOW_AUTH_CONFIG_PATH", "value": "/etc/mlflow/basic_auth.ini"},
        secret_env(o.secret, "MLFLOW_TRACKING_USERNAME", name="MLFLOW_AUTH_ADMIN_USERNAME"),
        secret_env(o.secret, "MLFLOW_TRACKING_PASSWORD", name="MLFLOW_AUTH_ADMIN_PASSWORD"),
        secret_env(o.secret, "MLFLOW_FLASK_SERVER_SECRET_KEY"),
        # The Host headers it answers: its Service's names (by default MLflow answers loopback and private IPs only)
        {"name": "MLFLOW_SERVER_ALLOWED_HOSTS", "value": ",".join(hosts)},
    ]


def _mlflow(o: K8sOptions) -> list[dict[str, Any]]:
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "hpolab-mlflow-auth", "namespace": o.namespace, "labels": labels("mlflow")},
              "data": {"basic_auth.ini": AUTH_INI}}
    container = {
        "name": "mlflow", "image": o.image,
        "command": ["mlflow", "server", "--app-name", "basic-auth", "--host", "0.0.0.0", "--port", str(MLFLOW_PORT),
                    "--artifacts-destination", "/artifacts", "--serve-artifacts"],
        "env": _mlflow_env(o),
        "ports": [{"containerPort": MLFLOW_PORT, "name": "mlflow"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": MLFLOW_PORT}, "periodSeconds": 5},  # open without login
        "volumeMounts": [{"name": "artifacts", "mountPath": "/artifacts"}, {"name": "auth-db", "mountPath": "/mlflow-auth"},
                         {"name": "auth-config", "mountPath": "/etc/mlflow", "readOnly": True}],
    }
    volumes = [{"name": "artifacts", "persistentVolumeClaim": {"claimName": "hpolab-mlflow-artifacts"}},
               {"name": "auth-db", "persistentVolumeClaim": {"claimName": "hpolab-mlflow-auth"}},
               {"name": "auth-config", "configMap": {"name": "hpolab-mlflow-auth"}}]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "hpolab-mlflow", "namespace": o.namespace, "labels": labels("mlflow")},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels("mlflow")},
                 "strategy": {"type": "Recreate"},  # one writer of the artifact and users' volumes at a time
                 "template": {"metadata": {"labels": labels("mlflow")},
                              "spec": {"containers": [container], "volumes": volumes}}},
    }
    return [_claim("hpolab-mlflow-artifacts", "50Gi", o), _claim("hpolab-mlflow-auth", "1Gi", o), config, deployment,
            _service("mlflow", MLFLOW_PORT, o.namespace)]


def store_manifests(o: K8sOptions) -> list[dict[str, Any]]:
    return [*_postgres(o), *_mlflow(o)]
