"""What `hpolab report` shows, read once from the stores: the Optuna study, its MLflow experiment and
parent run, the trial table, the LR range test's curve and the registry's promotion state.

Anything that cannot be read is recorded in `ReportData.problems` (the page's footer says it), so a
report can be made of a study in any state.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hpolab.stores.paths import Stores

TOP_ROWS = 10  # the report's top-trials table (report.py)

LR_RUN_NAME = "lr-range-test"
LR_KEYS = ("lr_test_lr", "lr_test_loss", "lr_test_smoothed_loss")  # its metrics, step = sweep step


@dataclass
class ReportData:
    """Everything the page shows, read once from the stores."""

    study: Any  # optuna.Study
    metric: str
    direction: str
    counts: Counter
    client: Any = None  # MlflowClient, None when the tracking store is unreachable
    experiment_id: str | None = None
    parent_run: Any = None
    table: Any = None  # hpolab.analysis.compare.study.StudyTable
    lr_test: dict[str, Any] | None = None  # {"lr": [...], "loss": [...], "smoothed": [...], "attr": {...}, "run_id": ...}
    promotion: dict[str, Any] = field(default_factory=dict)
    race: dict[str, Any] | None = None  # the latest finished promotion race's race.json (report/race.py)
    problems: list[str] = field(default_factory=list)  # what could not be read (shown in the footer)
    ui_url: str | None = None  # the MLflow UI trials' runs and models link to (report_trials.py); None: unknown

    @property
    def finished(self) -> int:
        return self.counts["COMPLETE"] + self.counts["PRUNED"] + self.counts["FAIL"]


def best_number(data: ReportData) -> int | None:
    """The best trial (several objectives: the knee of the feasible Pareto front; ranking.py)."""
    from hpolab.study.objectives import ranking

    best = ranking.best(data.study.get_trials(deepcopy=False), ranking.directions_of(data.study))
    return best.number if best is not None else None


def gather(study, stores: Stores | None = None, client=None) -> ReportData:
    from hpolab.analysis.compare.study import study_frame, study_metric, top_numbers
    from hpolab.study.objectives.ranking import primary_direction

    problems: list[str] = []
    experiment_id, parent = None, None
    if client is None and stores is not None:
        try:
            from hpolab.analysis.compare.study import tracking_client

            client = tracking_client(stores)
        except Exception as e:  # the report still has Optuna's side
            problems.append(f"MLflow tracking store not readable: {e}")
    if client is not None:
        try:
            exp = client.get_experiment_by_name(study.study_name)
            experiment_id = exp.experiment_id if exp is not None else None
        except Exception as e:
            problems.append(f"MLflow experiment lookup failed: {e}")
        parent_id = study.user_attrs.get("mlflow_parent_run_id")
        if parent_id:
            try:
                parent = client.get_run(parent_id)
            except Exception:
                problems.append(f"the study's parent run {parent_id} is not in the tracking store")
    metric = study_metric(study, client, experiment_id)
    # Runs of what the page shows only: the top complete trials and the failed ones
    table = study_frame(study, client, experiment_id, metric=metric, only=top_numbers(study, metric, "complete", TOP_ROWS, ("FAIL",)))
    counts = Counter(t.state.name for t in study.get_trials(deepcopy=False))
    data = ReportData(study, metric, primary_direction(study, metric), counts, client, experiment_id, parent, table, problems=problems)
    data.lr_test = _lr_test(study, client, experiment_id, problems)
    data.promotion = _promotion(study.study_name, client, problems)
    from hpolab.analysis.report.race import read_race

    data.race = read_race(study)
    return data


def _lr_test(study, client, experiment_id: str | None, problems: list[str]) -> dict[str, Any] | None:
    """The LR range test's curve, from its MLflow run (metrics lr_test_* with step = sweep step)."""
    attr = study.user_attrs.get("lr_range_test") or None
    run_id = (attr or {}).get("mlflow_run_id")
    if client is None:
        return {"attr": attr, "run_id": None, "lr": [], "loss": [], "smoothed": []} if attr else None
    try:
        if not run_id and experiment_id is not None:
            runs = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.runName` = '{LR_RUN_NAME}'",
                                      order_by=["attributes.start_time DESC"], max_results=1)
            run_id = runs[0].info.run_id if runs else None
        if not run_id:
            return {"attr": attr, "run_id": None, "lr": [], "loss": [], "smoothed": []} if attr else None
        series = {}
        for name in LR_KEYS:
            series[name] = {m.step: m.value for m in client.get_metric_history(run_id, name)}
        params = client.get_run(run_id).data.params
    except Exception as e:
        problems.append(f"LR range test run not readable: {e}")
        return {"attr": attr, "run_id": run_id, "lr": [], "loss": [], "smoothed": []} if attr else None
    return lr_curve(attr, run_id, series, params)


def lr_curve(attr: dict | None, run_id: str, series: dict[str, dict[int, float]], params: dict[str, str]) -> dict[str, Any]:
    """The LR range test entry of ReportData from its run's metric series (metric -> step -> value)."""
    steps = sorted(set(series["lr_test_lr"]) & set(series["lr_test_loss"]))
    return {
        "attr": attr,
        "run_id": run_id,
        "params": params,
        "lr": [series["lr_test_lr"][s] for s in steps],
        "loss": [series["lr_test_loss"][s] for s in steps],
        "smoothed": [series["lr_test_smoothed_loss"].get(s) for s in steps],
    }


def _promotion(name: str, client, problems: list[str]) -> dict[str, Any]:
    """The registry state: the registered model named like the study, its versions and aliases."""
    if client is None:
        return {"state": "unknown"}
    from mlflow.exceptions import MlflowException

    model = None
    try:
        model = client.get_registered_model(name)
    except MlflowException as e:
        if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            problems.append(f"model registry not readable: {e}")
            return {"state": "unknown"}
    except Exception as e:
        problems.append(f"model registry not readable: {e}")
        return {"state": "unknown"}
    if model is None:
        # `hpolab promote --model-name X` registers under another name; its versions carry the study.
        try:
            tagged = list(client.search_model_versions(f"tags.`hpolab.study` = '{name}'"))
            if tagged:
                name = tagged[0].name
                model = client.get_registered_model(name)
        except Exception:
            pass
    if model is None:
        return {"state": "none"}
    aliases = dict(getattr(model, "aliases", {}) or {})
    try:
        versions = list(client.search_model_versions(f"name = '{name}'"))
    except Exception as e:
        problems.append(f"model versions not readable: {e}")
        versions = []
    versions.sort(key=lambda v: int(v.version), reverse=True)
    champion = None
    if "champion" in aliases:
        try:
            champion = client.get_model_version_by_alias(name, "champion")
        except Exception as e:
            problems.append(f"champion version not readable: {e}")
    return registered(name, aliases, versions, champion)


def registered(name: str, aliases: dict[str, Any], versions: list, champion) -> dict[str, Any]:
    """The promotion entry of ReportData for a registered model (versions newest first)."""
    by_version = {str(v.version): [a for a, n in aliases.items() if str(n) == str(v.version)] for v in versions}
    return {"state": "registered", "name": name, "aliases": aliases, "versions": versions, "version_aliases": by_version, "champion": champion}
