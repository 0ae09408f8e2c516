"""The MLflow side of a study on an MLflow server, read in bulk over its REST API (`/api/2.0/mlflow/...`,
MLflow's documented REST API) with `requests`, without importing MLflow: for `compare` and the
pre-flight check of a tracking server.

Importing MlflowClient costs about 1.7 s of CPU on this machine, most of `compare --top 10`'s 2 s
budget; what compare reads is four requests: the experiment by name, the parent run (the study's
metric), one `runs/search` for the shown trials' runs, one paged `logged-models/search`. Runs and
models come back as mlflow_sql.RunFacts / ModelFacts (MLflow's own attribute names), the shape the
SQL reader of an embedded store gives, so the table is built by the same code.

The login is MLflow's: MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (basic) or
MLFLOW_TRACKING_TOKEN (bearer), MLFLOW_TRACKING_INSECURE_TLS, MLFLOW_TRACKING_SERVER_CERT_PATH and
MLFLOW_TRACKING_CLIENT_CERT_PATH. Anything else MLflow's client would add (an auth plugin named by
MLFLOW_TRACKING_AUTH, a workspace, a non-http URI) makes rest_for() None: the caller uses MlflowClient.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Iterator

from hpolab.stores.mlflow_sql import ModelFacts, RunData, RunFacts, RunInfo

TIMEOUT_S = 30  # per request (MLflow's client: 120 s and 7 retries, for a study riding out a restart)
RUN_IDS_PER_SEARCH = 100  # run ids per `attributes.run_id IN (...)` filter (a search filter's length is bounded)
PAGE = 1000  # runs/search and logged-models/search: MLflow's largest page for runs with their data
_NOT_HANDLED = ("MLFLOW_TRACKING_AUTH", "MLFLOW_WORKSPACE")


class RestError(Exception):
    """A request that failed: the connection (status None) or the server's answer (its HTTP status, MLflow error code)."""

    def __init__(self, message: str, status: int | None = None, code: str = "") -> None:
        super().__init__(message)
        self.status, self.code = status, code


class Rest:
    """One tracking server's REST API, with MLflow's login from the environment."""

    def __init__(self, uri: str, timeout: float = TIMEOUT_S) -> None:
        import requests

        self.timeout = timeout
        self.base = uri.rstrip("/") + "/api/2.0/mlflow/"
        self.session = requests.Session()
        self.requests = 0  # sent so far (tests and the benchmark count them)
        user, password, token = (os.environ.get(f"MLFLOW_TRACKING_{k}") for k in ("USERNAME", "PASSWORD", "TOKEN"))
        if user and password:
            self.session.auth = (user, password)
        elif token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() in ("true", "1"):
            self.session.verify = False
        elif os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH"):
            self.session.verify = os.environ["MLFLOW_TRACKING_SERVER_CERT_PATH"]
        if os.environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH"):
            self.session.cert = os.environ["MLFLOW_TRACKING_CLIENT_CERT_PATH"]

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import requests

        self.requests += 1
        try:
            r = (self.session.get(self.base + path, params=body, timeout=self.timeout) if method == "GET" else
                 self.session.post(self.base + path, json=body or {}, timeout=self.timeout))
        except requests.RequestException as e:
            raise RestError(str(e)) from None
        try:
            answer = r.json()
        except ValueError:
            answer = None
        if r.status_code != 200 or not isinstance(answer, dict):
            detail = answer if isinstance(answer, dict) else {}
            raise RestError(f"{r.status_code} {detail.get('message') or r.reason}", r.status_code, detail.get("error_code", ""))
        return answer

    def close(self) -> None:
        self.session.close()


def rest_for(uri: str, timeout: float = TIMEOUT_S) -> Rest | None:
    """A REST reader for an http(s) tracking URI, or None (MlflowClient reads it)."""
    if uri.split("://", 1)[0].lower() not in ("http", "https") or any(os.environ.get(k) for k in _NOT_HANDLED):
        return None
    return Rest(uri, timeout)


def reachable(uri: str, timeout: float = 10) -> bool:
    """True when `uri` is a tracking server this module reads and it answers an experiment search
    (what the pre-flight check asks) with this login; False otherwise (MlflowClient then says why)."""
    rest = rest_for(uri, timeout)
    if rest is None:
        return False
    try:
        rest.call("POST", "experiments/search", {"max_results": 1})
        return True
    except RestError:
        return False
    finally:
        rest.close()


def experiment_id(rest: Rest, name: str) -> str | None:
    """The id of the experiment named `name` (deleted ones too, as get_experiment_by_name), None when none."""
    try:
        return rest.call("GET", "experiments/get-by-name", {"experiment_name": name})["experiment"]["experiment_id"]
    except RestError as e:
        if e.code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def _run(r: dict[str, Any]) -> RunFacts:
    info, data = r.get("info", {}), r.get("data", {})
    metrics = {m["key"]: _float(m.get("value")) for m in data.get("metrics", [])}
    return RunFacts(RunInfo(info.get("run_id") or info.get("run_uuid"), info.get("status", ""), info.get("lifecycle_stage", ""),
                            info.get("artifact_uri", "")),
                    RunData(metrics, {t["key"]: t.get("value", "") for t in data.get("tags", [])},
                            {p["key"]: p.get("value", "") for p in data.get("params", [])}))


def _float(v: Any) -> float:
    """A metric value as the REST API writes it (a number, or "NaN" / "Infinity" / "-Infinity")."""
    return math.nan if v is None else float(v)


def get_run(rest: Rest, run_id: str) -> RunFacts | None:
    try:
        return _run(rest.call("GET", "runs/get", {"run_id": run_id})["run"])
    except RestError as e:
        if e.code == "RESOURCE_DOES_NOT_EXIST" or e.status == 404:
            return None
        raise


def search_runs(rest: Rest, experiment: str, filter_string: str = "", deleted: bool = False) -> dict[str, RunFacts]:
    """The experiment's runs matching `filter_string` (active ones; deleted too with `deleted`), by id, paged."""
    out: dict[str, RunFacts] = {}
    body: dict[str, Any] = {"experiment_ids": [experiment], "filter": filter_string, "max_results": PAGE,
                            "run_view_type": "ALL" if deleted else "ACTIVE_ONLY"}
    while True:
        page = rest.call("POST", "runs/search", body)
        out.update((run.info.run_id, run) for run in map(_run, page.get("runs", [])))
        if not page.get("next_page_token"):
            return out
        body["page_token"] = page["next_page_token"]


def run_id_filters(run_ids: Iterable[str]) -> Iterator[tuple[int, str]]:
    """MLflow search filters naming these runs, RUN_IDS_PER_SEARCH ids each, with how many ids each names
    (each id once): the one form of the search by id, for MlflowClient (mlflow_runs.runs_by_id) and REST."""
    ids = sorted(set(run_ids))
    for i in range(0, len(ids), RUN_IDS_PER_SEARCH):
        chunk = ids[i:i + RUN_IDS_PER_SEARCH]
        yield len(chunk), "attributes.run_id IN ({})".format(", ".join(f"'{r}'" for r in chunk))


def runs_by_id(rest: Rest, experiment: str, run_ids: Iterable[str]) -> dict[str, RunFacts]:
    """These runs of the experiment (active ones), one search per RUN_IDS_PER_SEARCH ids."""
    out: dict[str, RunFacts] = {}
    for _, filter_string in run_id_filters(run_ids):
        out.update(search_runs(rest, experiment, filter_string))
    return out


def logged_models(rest: Rest, experiment: str) -> dict[str, ModelFacts]:
    """The experiment's logged models that are not deleted (what search_logged_models gives), paged."""
    out: dict[str, ModelFacts] = {}
    body: dict[str, Any] = {"experiment_ids": [experiment], "max_results": PAGE}
    while True:
        page = rest.call("POST", "logged-models/search", body)
        for m in page.get("models", []):
            info = m.get("info", {})
            out[info["model_id"]] = ModelFacts(info["model_id"], info.get("artifact_uri", ""), info.get("name", ""))
        if not page.get("next_page_token"):
            return out
        body["page_token"] = page["next_page_token"]
