"""`hpolab launch k8s --with-stores`: a PostgreSQL and an MLflow server for a cluster that has none.

The same topology as docker-compose.yml: PostgreSQL holds the `optuna` and `mlflow` databases; the
MLflow server (the hpolab image has mlflow) keeps artifacts on its own volume and serves them. Its
passwords come from the Secret: POSTGRES_PASSWORD, and MLFLOW_BACKEND_STORE_URI, which mlflow reads
from its environment (never a command-line argument, where `ps` would show it). Both listen on all
of their pod's interfaces, which is what a Service needs; networkpolicy.yaml admits only the workers
(and MLflow to PostgreSQL). MLflow has no login here: keep it unexposed (no Ingress/LoadBalancer).
"""

from __future__ import annotations

from typing import Any

from hpolab.launch.k8s_parts import MLFLOW_PORT, POSTGRES_PORT, K8sOptions, labels, secret_env

POSTGRES_IMAGE = "postgres:16"
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


def _mlflow(o: K8sOptions) -> list[dict[str, Any]]:
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "hpolab-mlflow-artifacts", "namespace": o.namespace, "labels": labels("mlflow")},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "50Gi"}}}}
    container = {
        "name": "mlflow", "image": o.image,
        "command": ["mlflow", "server", "--host", "0.0.0.0", "--port", str(MLFLOW_PORT),
                    "--artifacts-destination", "/artifacts", "--serve-artifacts"],
        # MLflow's job runner (GenAI scorers, trace rollups): more processes and CPU, nothing hpolab uses
        "env": [secret_env(o.secret, "MLFLOW_BACKEND_STORE_URI"), {"name": "MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "value": "false"}],
        "ports": [{"containerPort": MLFLOW_PORT, "name": "mlflow"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": MLFLOW_PORT}, "periodSeconds": 5},
        "volumeMounts": [{"name": "artifacts", "mountPath": "/artifacts"}],
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "hpolab-mlflow", "namespace": o.namespace, "labels": labels("mlflow")},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels("mlflow")},
                 "strategy": {"type": "Recreate"},  # one writer of the artifact volume at a time
                 "template": {"metadata": {"labels": labels("mlflow")},
                              "spec": {"containers": [container],
                                       "volumes": [{"name": "artifacts",
                                                    "persistentVolumeClaim": {"claimName": "hpolab-mlflow-artifacts"}}]}}},
    }
    return [claim, deployment, _service("mlflow", MLFLOW_PORT, o.namespace)]


def store_manifests(o: K8sOptions) -> list[dict[str, Any]]:
    return [*_postgres(o), *_mlflow(o)]
