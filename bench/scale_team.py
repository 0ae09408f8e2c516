"""bench/scale.py --stores team: the scale benchmark on a team's stores.

1. The stores (bench/team_stores.py): PostgreSQL for Optuna and as MLflow's backend database, `mlflow
   server` with served artifacts, on 127.0.0.1, all kept under DIR (`--store`), so `--reuse` starts them
   again and times the commands without building anything.
2. The studies: `scale` (N one-epoch digits trials, `log_models=none`) and `scale-small` (N/5), each run by
   two `hpolab worker` processes at `parallel=1` as a team starts them; then small studies made with the
   storage API (3 trials each) and their MLflow experiments, up to 20 studies in all.
3. Each read command timed as a subprocess twice: first on quiet stores, counting the requests the MLflow
   server logged while it ran; then while a worker writes a third study (`scale-live`), as a team reads.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from scale import FLOOR, NAME, ROOT, SPEC, env, hpolab, print_table, time_commands
from team_stores import connections, team_stores

SMALL, LIVE = "scale-small", "scale-live"
STUDIES = 20  # `study list` is timed with this many studies in the stores
# (label, CLI args after the global ones, target seconds): the targets on a team's stores
COMMANDS = [(FLOOR, [], None), ("study status", ["study", "status", NAME], 1.0), ("study list", ["study", "list"], 1.0),
            ("compare --top 10", ["compare", NAME, "--top", "10"], 2.0),
            ("report", ["report", NAME, "--out", "{store}/reports/scale.html"], 8.0),
            ("study check", ["study", "check", NAME], 10.0)]


def spec(name: str) -> list[str]:
    return [SPEC[0], f"name={name}", *SPEC[2:], "log_models=none"]


def start_worker(store: Path, urls: dict[str, str], name: str, n: int, i: int, log) -> subprocess.Popen:
    cmd = hpolab(store / f"worker{i}", "worker", *spec(name), f"n_trials={n}", "parallel=1")
    return subprocess.Popen(cmd, cwd=ROOT, env={**env(), **urls}, stdout=log, stderr=subprocess.STDOUT)


def run_workers(store: Path, urls: dict[str, str], name: str, n: int, workers: int = 2) -> float:
    """`workers` workers share study `name` of `n` trials; the seconds they took. Samples the
    PostgreSQL connections of the Optuna database while they run (the highest in store/connections.json)."""
    t0 = time.perf_counter()
    with (store / f"bench-{name}.log").open("w") as log:
        procs = [start_worker(store, urls, name, n, i, log) for i in range(workers)]
        peak = 0
        while any(p.poll() is None for p in procs):
            peak = max(peak, connections(urls["OPTUNA_STORAGE"], "optuna"))
            time.sleep(2.0)
    if any(p.returncode for p in procs):
        sys.exit(f"scale: a worker of {name} failed ({[p.returncode for p in procs]}); see {store / f'bench-{name}.log'}")
    print(f"{name}: {n} trials by {workers} workers in {time.perf_counter() - t0:.0f} s (Optuna database connections: at most {peak})",
          flush=True)
    return time.perf_counter() - t0


def small_studies(urls: dict[str, str], count: int) -> None:
    """`count` small studies (3 trials each, COMPLETE) and their MLflow experiments, through the APIs."""
    import optuna
    from mlflow import MlflowClient

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    client = MlflowClient(tracking_uri=urls["MLFLOW_TRACKING_URI"])
    for i in range(count):
        name = f"team-{i:02d}"
        study = optuna.create_study(storage=urls["OPTUNA_STORAGE"], study_name=name, direction="maximize", load_if_exists=True)
        study.set_user_attr("metric", "val_acc")
        for _ in range(3 - len(study.trials)):
            t = study.ask()
            study.tell(t, 0.5 + t.suggest_float("trainer.lr", 1e-4, 1e-1, log=True))
        if client.get_experiment_by_name(name) is None:
            client.create_experiment(name)


def pad_study(urls: dict[str, str], name: str, n: int) -> int:
    """Grow study `name` to `n` trials with copies of its real finished ones (for timing the reads at a
    size the workers would take too long to make here): each copy has its source's params, values,
    intermediate values and attrs in Optuna, and an MLflow run under the same parent with its
    source's tags, params and latest metrics (the run's own id and trial number). Returns how many."""
    import optuna
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # (its "View run ..." line per run)
    study = optuna.load_study(study_name=name, storage=urls["OPTUNA_STORAGE"])
    client = MlflowClient(tracking_uri=urls["MLFLOW_TRACKING_URI"])
    real = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished() and t.user_attrs.get("mlflow_run_id")]
    added, number = 0, len(study.trials)
    while number < n:
        src = real[added % len(real)]
        run = client.get_run(src.user_attrs["mlflow_run_id"])
        tags = {**run.data.tags, "optuna.trial_number": str(number), "mlflow.runName": f"trial-{number}"}
        new = client.create_run(run.info.experiment_id, run_name=f"trial-{number}", tags=tags)
        client.log_batch(new.info.run_id, metrics=[Metric(k, v, 0, 1) for k, v in run.data.metrics.items()],
                         params=[Param(k, v) for k, v in run.data.params.items()])
        client.set_terminated(new.info.run_id, run.info.status)
        study.add_trial(optuna.trial.create_trial(state=src.state, values=src.values, params=src.params, distributions=src.distributions,
                                                  user_attrs={**src.user_attrs, "mlflow_run_id": new.info.run_id},
                                                  system_attrs=src.system_attrs, intermediate_values=src.intermediate_values))
        added, number = added + 1, number + 1
    return added


def rates(storage: str, name: str, real: int) -> dict:
    """The study's trials/s: overall (first start to last end), over its first and its last 100 trials
    (of its first `real` trials: the workers', not pad_study's copies)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = [t for t in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False) if t.number < real]
    ends = sorted(t.datetime_complete.timestamp() for t in trials if t.datetime_complete)
    starts = sorted(t.datetime_start.timestamp() for t in trials if t.datetime_start)
    if len(ends) < 2:
        return {"n": len(ends)}
    k = min(100, len(ends) // 2)
    return {"n": len(ends), "overall": len(ends) / (ends[-1] - starts[0]),
            "first": k / (ends[k - 1] - starts[0]), "last": k / (ends[-1] - ends[-k - 1]), "window": k}


def server_requests(store: Path) -> int:
    """Requests the MLflow server has logged so far (uvicorn's access lines)."""
    log = store / "mlflow-server.log"
    return sum(1 for line in log.read_text(errors="replace").splitlines() if ' HTTP/1.1" ' in line) if log.exists() else 0


def quiet_pass(store: Path, urls: dict[str, str]) -> list[dict]:
    rows = []
    for command in COMMANDS:
        before = server_requests(store)
        rows += time_commands(store / "reader", urls, [command])
        rows[-1]["requests"] = server_requests(store) - before
    return rows


def live_pass(store: Path, urls: dict[str, str]) -> tuple[list[dict], dict[str, int]]:
    """The commands timed while one worker writes study LIVE (started first, one trial done)."""
    import optuna

    with (store / f"bench-{LIVE}.log").open("a") as log:
        proc = start_worker(store, urls, LIVE, 100000, 9, log)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if optuna.load_study(study_name=LIVE, storage=urls["OPTUNA_STORAGE"]).get_trials(deepcopy=False, states=[optuna.trial.TrialState.COMPLETE]):
                    break
            except KeyError:
                pass
            time.sleep(2.0)
        rows = time_commands(store / "reader", urls, COMMANDS)
        peak = {db: connections(urls["OPTUNA_STORAGE"], db) for db in ("optuna", "mlflow")}
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: its running trial is queued to resume
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
    return rows, peak


def run_team(store: Path, trials: int, reuse: bool, json_out: Path | None, pad_to: int = 0) -> None:
    store.mkdir(parents=True, exist_ok=True)
    built = store / "team-built.json"
    with team_stores(store, env()) as (storage, tracking):
        urls = {"OPTUNA_STORAGE": storage, "MLFLOW_TRACKING_URI": tracking}
        print(f"stores: {storage}  {tracking}", flush=True)
        if not (reuse and built.exists()):
            made = {"trials": trials, "seconds": run_workers(store, urls, NAME, trials)}
            made["small_seconds"] = run_workers(store, urls, SMALL, max(trials // 5, 1))
            small_studies(urls, STUDIES - 3)
            built.write_text(json.dumps(made))
        made = json.loads(built.read_text())
        if pad_to > made.get("size", made["trials"]):
            made["padded"] = made.get("padded", 0) + pad_study(urls, NAME, pad_to)
            made["size"] = pad_to
            built.write_text(json.dumps(made))
        quiet = quiet_pass(store, urls)
        live, peak = live_pass(store, urls)
        driver = rates(storage, NAME, made["trials"])
    one, five, fifteen = os.getloadavg()
    res = {"stores": "team", "trials": made.get("size", made["trials"]), "padded": made.get("padded", 0), "parallel": "1 x 2 workers", "load": f"{one:.2f}/{five:.2f}/{fifteen:.2f}",
           "build_seconds": made["seconds"], "commands": live, "quiet": quiet, "driver": driver, "connections_live": peak}
    print_team(res)
    if json_out:
        json_out.write_text(json.dumps(res, indent=1))


def print_team(res: dict) -> None:
    print_table(res)  # the figures while a third study is written
    if res["padded"]:
        print(f"({res['padded']} of the {res['trials']} trials are copies of the real ones: scale_team.pad_study)")
    print(f"{'(CPU s of each command)':<34} " + " / ".join(f"{r['cpu']:.2f}" for r in res["commands"]))
    print(f"\n{'quiet stores':<34} {'wall s':>8} {'CPU s':>8} {'MLflow requests':>16}")
    for r in res["quiet"]:
        print(f"{r['command']:<34} {r['seconds']:>8.2f} {r['cpu']:>8.2f} {r['requests']:>16}" + (f"  rc={r['rc']} {r['note']}" if r["note"] else ""))
    d = res["driver"]
    if "overall" in d:
        print(f"\n2 workers, {d['n']} trials: {d['overall']:.2f} trials/s overall; first {d['window']}: {d['first']:.2f}/s, "
              f"last {d['window']}: {d['last']:.2f}/s ({d['last'] / d['first']:.2f}x; target >= 2 trials/s, >= 0.9x)")
    c = res["connections_live"]
    print(f"PostgreSQL client connections after the commands, a worker writing: optuna {c['optuna']}, mlflow {c['mlflow']} "
          "(the MLflow server's pools: 4 processes)")
