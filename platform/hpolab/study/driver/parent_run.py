"""The study's parent run in MLflow: one per study, shared by every worker that joins it.

Its id is the Optuna study user attr `mlflow_parent_run_id`; it carries the spec (params, logged
once; spec.yaml and accepted changes spec-<n>.yaml: spec_guard.py) and, when a driver closes, the
trial counts, the best trial so far and why the study stopped early (`hpolab.stop_reason`).
"""

from __future__ import annotations

from pathlib import Path

import optuna

from hpolab.config.spec import StudySpec
from hpolab.stores import mlflow_runs as tr


def open_parent_run(client, experiment_id: str, study: optuna.Study, spec: StudySpec, env_tags: dict[str, str]) -> str:
    """The study's parent run id: the recorded one (set RUNNING again), or a new one."""
    run_id = study.user_attrs.get("mlflow_parent_run_id")
    if run_id:
        try:
            client.get_run(run_id)
            client.update_run(run_id, status="RUNNING")
            return run_id
        except Exception:
            run_id = None  # the MLflow store was reset; start a new parent
    run = client.create_run(
        experiment_id,
        run_name=spec.name,
        tags={"optuna.study": spec.name, "hpolab.role": "study", **env_tags},
    )
    mine = run.info.run_id
    # Workers started together may each have created a parent. All of them pick the same one
    # (the earliest; run id breaks ties) and drop their own empty duplicate.
    live = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`hpolab.role` = 'study' and tags.`optuna.study` = '{spec.name}'",
    )
    current = study.user_attrs.get("mlflow_parent_run_id")
    chosen = current if current in {r.info.run_id for r in live} else min(
        live, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id
    if chosen != mine:
        client.delete_run(mine)
        return chosen
    study.set_user_attr("mlflow_parent_run_id", mine)
    tr.log_params(client, mine, tr.flatten(spec.model_dump(mode="json", exclude={"search_space", "enqueue"})))
    return mine


def close_parent_run(client, parent_run_id: str, study: optuna.Study, spec: StudySpec, counts: dict[str, int],
                     stop_reason: str | None = None) -> None:
    """Tag the trial counts and the best trial; FINISHED when the budget is spent or the study was
    stopped (`stop_reason`: stop_after_no_improvement), else KILLED (a re-run continues the study)."""
    tags = {f"hpolab.trials_{k}": str(v) for k, v in counts.items()}
    tags["hpolab.n_trials"] = str(spec.n_trials)  # the budget now (a re-run may raise it)
    if spec.is_multi_objective:
        tags.update(front_tags(client, parent_run_id, study, spec))
    else:
        tags.update(_best_tags(client, parent_run_id, study, spec))
    if stop_reason:
        tags["hpolab.stop_reason"] = stop_reason
    tr.set_tags(client, parent_run_id, tags)
    done = counts["finished"] >= spec.n_trials or stop_reason is not None
    client.set_terminated(parent_run_id, status="FINISHED" if done else "KILLED")


def _best_tags(client, parent_run_id: str, study: optuna.Study, spec: StudySpec) -> dict[str, str]:
    tags = {}
    from hpolab.study.objectives import ranking

    best = ranking.best(study.get_trials(deepcopy=False), ranking.directions_of(study))  # (feasible, not imported)
    if best is not None:
        tags.update(
            {
                "hpolab.best_trial": str(best.number),
                f"hpolab.best_{spec.metric}": repr(best.value),
                "hpolab.best_run_id": best.user_attrs.get("mlflow_run_id", ""),
            }
        )
        client.log_metric(parent_run_id, f"best_{spec.metric}", float(best.value))
    return tags


def front_tags(client, parent_run_id: str, study: optuna.Study, spec: StudySpec) -> dict[str, str]:
    """Several objectives: the Pareto front as `pareto_front.json` (trial, run, values) and tags
    (its trials, its knee -- ranking.py), and the front's hypervolume (its history in the file)."""
    import json
    import tempfile

    from hpolab.study.objectives import ranking

    names, directions = [o.metric for o in spec.objective_list], ranking.directions_of(study)
    trials = study.get_trials(deepcopy=False)
    on_front = ranking.front(trials, directions)
    rows = [{"trial": t.number, "run_id": t.user_attrs.get("mlflow_run_id", ""), **dict(zip(names, t.values))} for t in on_front]
    history = ranking.hypervolume_history(trials, directions)  # (its reference point moves as trials come)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pareto_front.json"
        path.write_text(json.dumps({"objectives": [o.model_dump() for o in spec.objective_list], "front": rows,
                                    "hypervolume": [{"trial": n, "hypervolume": hv} for n, hv in history]}, indent=1))
        client.log_artifact(parent_run_id, str(path))
    if history:  # step: how many feasible COMPLETE trials it was measured over
        client.log_metric(parent_run_id, "hypervolume", history[-1][1], step=len(history))
    knee = ranking.knee(on_front, directions)
    tags = {"hpolab.pareto_front": ",".join(str(t.number) for t in on_front)[:4000]}
    if knee is not None:
        tags.update({"hpolab.best_trial": str(knee.number), "hpolab.best_rule": "knee of the Pareto front",
                     "hpolab.best_run_id": knee.user_attrs.get("mlflow_run_id", "")})
    return tags


def fail_parent_run(client, parent_run_id: str, error: str) -> None:
    """The driver stopped with an error: say so on the parent run and close it FAILED (a re-run of
    the same command opens it again)."""
    tr.set_tags(client, parent_run_id, {"hpolab.driver_error": error[:4000]})
    client.set_terminated(parent_run_id, status="FAILED")
