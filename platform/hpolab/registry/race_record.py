"""A promotion race in MLflow and Optuna: its `race` run, each round's standings, its result.

    study parent run
      `-- race                      role `race`; params: candidates, seeds, race_top, race_seeds, alpha
            |                        metrics per round (step = round): <candidate>.<metric>_mean,
            |                        _ci95_low, _ci95_high, <candidate>.p_best, <candidate>.seeds, noise_floor
            |                        tags at the end: hpolab.race_winner, hpolab.race_result (JSON);
            |                        artifact race.json (every seed's value and run)
            `-- race-trial_19-seed-1 one seed run: a trial of the companion Optuna study `<study>.race-<key>`,
                ...                  tagged hpolab.race_candidate and hpolab.seed, named once it completed

The companion study's `mlflow_parent_run_id` is the race run, so the driver that runs the seed trials
files their runs under it (study/driver/parent_run.py reopens a recorded parent). The race run is found
by its key before one is made (a promote killed between making it and recording it on the companion
finds it again). A round's metrics are logged once: `hpolab.race_rounds_recorded` says how many are.

The study keeps what the race measured of its noise: the Optuna study attr `hpolab.noise_floor`
({value, metric, source, dof, ...}; `study status`, `compare` and the report show it).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

from hpolab.stores import mlflow_runs as tr
from hpolab.stores.run_roles import RACE, ROLE
from hpolab.study.objectives.noise import NOISE_FLOOR, RACE_ATTR

RACE_KEY = "hpolab.race_key"
RACE_STUDY = "hpolab.race_study"  # on the race run: its companion Optuna study
RACE_OF = "hpolab.race_of"  # on the companion Optuna study: the study it races for
ROUNDS_RECORDED = "hpolab.race_rounds_recorded"
WINNER = "hpolab.race_winner"
RESULT = "hpolab.race_result"
MAX_TAG = 5000


def open_race_run(client, info, plan, companion) -> str:
    """The race's run under the study's parent run: recorded on the companion, found by key, or new."""
    recorded = companion.user_attrs.get("mlflow_parent_run_id")
    if recorded:
        try:
            client.get_run(recorded)
            return recorded
        except Exception:  # noqa: BLE001 -- the MLflow store was reset: find or make it again
            pass
    found = list(tr.find_runs(client, info.experiment_id, f"tags.`{ROLE}` = '{RACE}' and tags.`{RACE_KEY}` = '{plan.key}'"))
    if found:
        run_id = min(found, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id
    else:
        run_id = _new_race_run(client, info, plan)
    companion.set_user_attr("mlflow_parent_run_id", run_id)
    return run_id


def finished(client, info, key: str) -> bool:
    """Whether the race with this key has recorded its result (then nothing is left to train)."""
    runs = tr.find_runs(client, info.experiment_id, f"tags.`{ROLE}` = '{RACE}' and tags.`{RACE_KEY}` = '{key}'")
    return any(r.data.tags.get(WINNER) for r in runs)


def _new_race_run(client, info, plan) -> str:
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

    from hpolab.registry.race_stats import ALPHA, FIRST_ROUND

    run = client.create_run(info.experiment_id, run_name="race", tags={
        MLFLOW_PARENT_RUN_ID: info.parent_run_id, MLFLOW_RUN_NAME: "race", ROLE: RACE,
        "optuna.study": info.name, RACE_KEY: plan.key, RACE_STUDY: plan.companion})
    tr.log_params(client, run.info.run_id, {
        "candidates": ", ".join(c.label for c in plan.candidates), "seeds": ",".join(map(str, plan.seeds)),
        "race_top": str(plan.top), "race_seeds": str(len(plan.seeds)), "metric": info.metric,
        "alpha": str(ALPHA), "first_round": str(FIRST_ROUND),
        **{f"{c.key}.run_id": c.run_id for c in plan.candidates}}, new_run=True)
    return run.info.run_id


def record_round(client, run_id: str, standings: dict, keys: dict[str, str], metric: str, rnd: int,
                 noise: float | None) -> None:
    """Log a round's standings (once: a replayed round logs nothing again)."""
    run = client.get_run(run_id)
    if int(run.data.tags.get(ROUNDS_RECORDED, "0")) >= rnd:
        return
    values = {"noise_floor": noise} if noise is not None else {}
    for label, s in standings.items():
        k = keys[label]
        values.update({f"{k}.{metric}_mean": s.mean, f"{k}.{metric}_ci95_low": s.ci[0], f"{k}.{metric}_ci95_high": s.ci[1],
                       f"{k}.p_best": s.p_best, f"{k}.seeds": float(len(s.values))})
    tr.log_epoch(client, run_id, rnd, {k: v for k, v in values.items() if v is not None and not math.isnan(v)})
    tr.set_tags(client, run_id, {ROUNDS_RECORDED: str(rnd)})


def name_seed_runs(client, experiment_id: str, run_id: str, keys: dict[str, str]) -> None:
    """Give each finished seed run under the race run a name that says what it is (race-trial_19-seed-1;
    the driver named it trial-<n> after its trial in the race's Optuna study)."""
    from hpolab.study.sampling.seed_trials import CANDIDATE, SEED

    for run in tr.find_runs(client, experiment_id, f"tags.`mlflow.parentRunId` = '{run_id}' and attributes.status = 'FINISHED'"):
        label, seed = run.data.tags.get(CANDIDATE), run.data.tags.get(SEED)
        if label in keys and seed is not None and run.info.run_name.startswith("trial-"):
            client.update_run(run.info.run_id, name=f"race-{keys[label]}-seed-{seed}")


def record_result(client, run_id: str, result, study) -> None:
    """The race's outcome on its run (tags, race.json; then FINISHED) and the noise floor on the study."""
    summary = result.summary()
    run = client.get_run(run_id)
    if run.data.tags.get(WINNER) is None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "race.json"
            path.write_text(json.dumps(summary, indent=1))
            client.log_artifact(run_id, str(path))
        tr.set_tags(client, run_id, {WINNER: str(result.winner), RESULT: json.dumps(compact(summary))[:MAX_TAG],
                                     "hpolab.race_epochs": str(result.epochs)})
    if run.info.status != "FINISHED":
        client.set_terminated(run_id, status="FINISHED")
    study.set_user_attr(RACE_ATTR, {**compact(summary), "run_id": run_id})  # (what the report shows)
    if result.noise is not None:
        study.set_user_attr(NOISE_FLOOR, {"value": result.noise, "metric": result.metric, "source": "race", "dof": result.dof,
                                          "configurations": sum(bool(s.values) for s in result.standings.values()),
                                          "runs": sum(len(s.values) for s in result.standings.values()),
                                          "race_run_id": run_id, "at": time.strftime("%Y-%m-%d %H:%M:%S")})


def compact(summary: dict) -> dict:
    """race.json without each seed's run id: what fits a tag."""
    return {**{k: v for k, v in summary.items() if k != "candidates"},
            "candidates": [{k: v for k, v in c.items() if k != "runs"} for c in summary["candidates"]]}


def version_tags(result, label: str, seed: int, run_id: str) -> dict[str, str]:
    """What the registered version records of the race its model won."""
    s = result.standings[label]
    tags = {"hpolab.race_run_id": result.run_id, "hpolab.race_winner": label, "hpolab.race_seed": str(seed),
            "hpolab.race_model_run": run_id, "hpolab.race_seeds": ",".join(str(k) for k in sorted(s.values)),
            f"hpolab.race_{result.metric}_mean": repr(s.mean), f"hpolab.race_{result.metric}_ci95": f"{s.ci[0]!r},{s.ci[1]!r}",
            "hpolab.race_p_best": repr(s.p_best), "hpolab.race_result": json.dumps(compact(result.summary()))[:MAX_TAG]}
    if result.noise is not None:
        tags["hpolab.noise_floor"] = repr(result.noise)
    return tags
