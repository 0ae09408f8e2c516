"""Where the driver's time per trial goes: `hpolab study run` in this process, its parts timed.

    PYTHONPATH=platform .venv/bin/python bench/trial_profile.py [--trials 12] [--epochs 8]
        [--log-models default|none] [--stores embedded|team] [--asha] [--json FILE]

Runs a small digits study (random sampler, no pruning, no early stopping, parallel 1: as
bench/overhead.py) through the real CLI code path (`hpolab.cli.main`) in this interpreter, with timing
wrappers on the driver's parts (the classes' methods and the module functions they call), so the
numbers are the real ones plus a wrapper's microseconds. Per trial it reports, by thread:

- main (the driver's loop, the trial's critical path at parallel 1): claim (budget count, ask, owner,
  first heartbeat), the run's start (create, params, config.yaml, code artifact), each epoch's
  handling (pruner report, should_prune, checkpoint staging, metric logging, heartbeat), the end (tell,
  read-back, retention plan and rank tags, the progress line's counts), and the loop's idle wait;
- uploader (the background writer): checkpoint uploads, the model, linking, the close, retention;
- the trial's own timeline as the driver sees it: spawn -> first epoch message, last epoch -> done;
- a segment's start, claim to first epoch, phase by phase (bench/trial_phases.py): the driver's claim,
  the run's start (or a resume's run state and checkpoint), the spawn, and in the trial process the
  fork, the experiment lookup, data, model, fit's set-up, the checkpoint's load and its state, the
  first batch and the first epoch; fresh trials and, with --asha (a trial scheduler pausing at rungs
  1, 3, 9... and resuming from checkpoints), resumed segments;
- store traffic: SQL statements by database (SQLAlchemy's cursor events) and, on team stores, HTTP
  requests to the MLflow server by endpoint (requests' Session.request), each by thread.

--stores team starts PostgreSQL (Optuna) and `mlflow server` (PostgreSQL backend, served artifacts)
on loopback (tests/services.py, as the tests do) for the run, and removes them after.
The load average is printed before and after: 2 shared cores make single runs noisy.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT / "tests"), str(ROOT / "bench")]
import trial_phases  # noqa: E402
COMMON = ["sampler={type: random}", "pruner={type: none}", "trainer.early_stopping_patience=null"]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min, {os.cpu_count()} cores)"


def thread_kind() -> str:
    t = threading.current_thread()
    if t is threading.main_thread():
        return "main"
    return "waiter" if t.name.startswith("waiting:") else t.name.split("-")[0]


class Recorder:
    """Calls and seconds per (thread kind, part); a timeline of per-trial marks on the main thread."""

    def __init__(self) -> None:
        self.parts: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0, 0.0])
        self.marks: dict[int, dict[str, float]] = collections.defaultdict(dict)
        self.sql: collections.Counter = collections.Counter()
        self.http: collections.Counter = collections.Counter()
        self.lock = threading.Lock()

    def add(self, part: str, seconds: float) -> None:
        with self.lock:
            p = self.parts[(thread_kind(), part)]
            p[0] += 1
            p[1] += seconds

    def wrap(self, owner, attr: str, part: str, mark=None) -> None:
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = time.perf_counter()
                self.add(part, t1 - t0)
                if mark is not None:
                    mark(self, args, t0, t1)

        setattr(owner, attr, timed)


def _number(arg) -> int:
    return arg if isinstance(arg, int) else arg.number  # a trial number, a Running, an optuna.Trial


def _mark_epoch(rec: Recorder, args, t0: float, t1: float) -> None:
    m = rec.marks[_number(args[1])]
    m.setdefault("first_epoch", t0)
    m["last_epoch"] = t1


def _mark(name: str, at_start: bool = True):
    def mark(rec: Recorder, args, t0: float, t1: float) -> None:
        rec.marks[_number(args[1])][name] = t0 if at_start else t1
    return mark


# (module, owner attribute or None for the module itself, attribute, part label). Labels sort the
# table: "1" start, "2" epoch, "3" end, "4" loop, "5" background.
def _both(*marks):
    def mark(rec: Recorder, args, t0: float, t1: float) -> None:
        for m in marks:
            if m is not None:
                m(rec, args, t0, t1)
    return mark


def targets(segs: trial_phases.Segments):
    from mlflow import MlflowClient
    import optuna

    from hpolab.stores import mlflow_runs as tr
    from hpolab.study.driver import driver, events, pauses, progress
    from hpolab.study.objectives import pruning, stopping
    from hpolab.study.retention import retention
    from hpolab.study.state import lifecycle
    from hpolab.study.trials import runner, tracker

    D, E, T = driver.Driver, events.TrialEvents, tracker.TrialTracker
    return [
        (D, "_claim_trial", "1 start: claim (budget lock, dead trials?, count, ask, owner, heartbeat)", segs.claimed),
        (D, "reap", "1 start:   reap dead trials (when the claim's read finds one)", None),
        (optuna.Study, "ask", "1 start:   ask", None),
        *([(lifecycle, "ask_new", "1 start:   ask a new trial (no look for a WAITING one)", None)] if hasattr(lifecycle, "ask_new") else []),
        (driver, "trial_counts", "1 start:   trial counts (budget) / loop counts", None),
        (D, "_start_trial", "1 start: start trial (run, params, files, spawn)", _both(_mark("start"), segs.started("fresh"))),
        (driver, "retry_source", "1 start:   retry source", None),
        (T, "start_run", "1 start:   start_run", None),
        (tr, "start_child_run", "1 start:     create run", None),
        (tr, "log_params", "1 start:     params", None),
        (MlflowClient, "log_batch", "1 start:     (any thread) client.log_batch", None),
        (runner.TrialRunner, "spawn_trial", "1 start:   spawn trial process (or go)", _both(_mark("spawned", at_start=False), segs.go)),
        *([(runner.TrialRunner, "_fork", "1 start:   fork trial process", segs.fork)] if hasattr(runner.TrialRunner, "_fork") else []),
        (pauses.Pauses, "start", "1 resume: start (config, checkpoint, run state, spawn)", segs.started("resume")),
        (pauses.Pauses, "plan", "1 resume:   plan (pause point, threads)", None),
        (pauses.Pauses, "_checkpoint", "1 resume:   checkpoint (local, else fetched)", None),
        (T, "resume", "1 resume:   run state (tags, metrics batch)", None),
        (pauses.Pauses, "claim", "1 resume: claim a paused trial (scheduler, claim_paused)", None),
        (pauses.Pauses, "pause", "3 end: pause (checkpoint uploaded, marks)", None),
        (T, "pause", "3 end:   tracker.pause (upload queued and landed, tags)", None),
        (E, "on_epoch", "2 epoch: on_epoch", _both(_mark_epoch, segs.first_epoch)),
        (pruning.Pruning, "report", "2 epoch:   pruner report", None),
        (pruning.Pruning, "should_prune", "2 epoch:   should_prune", None),
        (T, "stage_upload", "2 epoch:   stage checkpoint", None),
        (T, "log_epoch", "2 epoch:   log metrics", None),
        (events, "beat", "2 epoch:   heartbeat", None),
        (progress.Progress, "epoch", "2 epoch:   progress", None),
        (E, "on_done", "3 end: on_done", _mark("done")),
        (E, "_tell", "3 end:   tell + read back", None),
        (T, "finish", "3 end:   tracker.finish (queue model/close)", None),
        (T, "_retain", "3 end:     retention plan + rank tags", None),
        (retention.Retention, "skip_model", "3 end:     model skip check (top_k)", None),
        (events, "trial_counts", "3 end:   counts for the progress line", None),
        (progress.Progress, "trial_finished", "3 end:   progress line", _mark("finished", at_start=False)),
        (runner.TrialRunner, "retire", "3 end: retire process", None),
        (stopping.NoImprovementStop, "should_stop", "4 loop: no-improvement check", None),
        (driver, "wait", "4 loop: idle wait for messages", None),
        (MlflowClient, "log_artifact", "5 any: client.log_artifact", None),
        (T, "_upload", "5 bg: checkpoint upload + tag", None),
        (T, "_log_model_then_close", "5 bg: model, tidy, close", None),
        (T, "_log_model", "5 bg:   log model + links", None),
        (tracker, "link_trial_metrics", "5 bg:     link metrics to model", None),
        (tracker, "tidy_finished", "5 bg:   tidy last.pt", None),
        (T, "close_run", "5 bg:   close run", None),
        (retention.Retention, "purge", "5 bg: retention purge", None),
        (tracker, "apply_rank_tags", "5 bg: rank tags", None),
    ]


def count_store_traffic(rec: Recorder) -> None:
    import requests
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def on_sql(conn, cursor, statement, parameters, context, executemany):
        db = (conn.engine.url.database or "?").rsplit("/", 1)[-1]
        with rec.lock:
            rec.sql[(thread_kind(), db)] += 1

    event.listen(Engine, "before_cursor_execute", on_sql)
    send = requests.Session.request

    def request(self, method, url, *args, **kwargs):
        path = re.sub(r"/[0-9a-f]{32}(/|$)", r"/<id>\1", url.split("?", 1)[0].split("/", 3)[-1])
        path = re.sub(r"(artifacts/[^/]+/[^/]+/)(<id>/)?.*", r"\1...", path)
        with rec.lock:
            rec.http[(thread_kind(), f"{method} /{path}")] += 1
        return send(self, method, url, *args, **kwargs)

    requests.Session.request = request


@contextlib.contextmanager
def team_stores():
    """PostgreSQL + mlflow server (PostgreSQL backend, served artifacts) on loopback; yields argv."""
    from services import as_postgres, free_port, postgres_cluster, wait_for_http

    with postgres_cluster() as (bin_dir, port, _):
        for db in ("optuna", "mlflow"):
            as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", db)
        pg = f"postgresql+psycopg2://postgres@127.0.0.1:{port}"
        arts = Path(tempfile.mkdtemp(prefix="hpolab-profile-arts-"))
        http = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"{pg}/mlflow",
                                 "--artifacts-destination", arts.as_uri(), "--host", "127.0.0.1", "--port", str(http),
                                 "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        try:
            wait_for_http(f"http://127.0.0.1:{http}/health", proc)
            yield ["--storage", f"{pg}/optuna", "--tracking-uri", f"http://127.0.0.1:{http}"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            shutil.rmtree(arts, ignore_errors=True)


def timeline(rec: Recorder) -> dict[str, float]:
    """Mean seconds per trial between the driver's marks (trial 0 left out: the first fork waits for
    the forkserver's imports)."""
    spans = {"spawned -> first epoch message (fork, data, model, fit set-up, epoch 1)": ("spawned", "first_epoch"),
             "last epoch handled -> done message (best.pt, export in the child)": ("last_epoch", "done"),
             "done -> trial finished on the driver (tell, queue, progress)": ("done", "finished")}
    nums = sorted(rec.marks)[1:]
    out = {}
    for label, (a, b) in spans.items():  # (under --asha a trial's marks are its last segment's; a paused one has no finish)
        have = [rec.marks[n][b] - rec.marks[n][a] for n in nums if a in rec.marks[n] and b in rec.marks[n]]
        if have:
            out[label] = sum(have) / len(have)
    gaps = [rec.marks[n]["start"] - rec.marks[n - 1]["finished"] for n in nums
            if "start" in rec.marks[n] and "finished" in rec.marks.get(n - 1, {})]
    if gaps:
        out["previous trial finished -> this trial's start (loop, reap, claim)"] = sum(gaps) / len(gaps)
    return out


def report(rec: Recorder, trials: int, wall: float) -> dict:
    rows = sorted(((part, kind, n, s) for (kind, part), (n, s) in rec.parts.items()), key=lambda r: (r[0][0], r[1] != "main"))
    print(f"\nper trial (mean over {trials} trials), ms; wall {wall:.1f} s = {1000 * wall / trials:.0f} ms/trial\n")
    print(f"| part | thread | calls/trial | ms/call | ms/trial |\n| --- | --- | --- | --- | --- |")
    table = []
    for part, kind, n, s in rows:
        table.append({"part": part[2:], "thread": kind, "calls_per_trial": n / trials, "ms_per_trial": 1000 * s / trials})
        print(f"| {part[2:]} | {kind} | {n / trials:.1f} | {1000 * s / n:.1f} | {1000 * s / trials:.1f} |")
    tl = timeline(rec)
    print("\ntrial timeline as the driver sees it (mean s per trial, trials 1..n-1)\n")
    for label, v in tl.items():
        print(f"- {label}: {v:.3f}")
    print("\nSQL statements per trial by thread and database:",
          ", ".join(f"{k}/{db} {n / trials:.1f}" for (k, db), n in sorted(rec.sql.items())))
    if rec.http:
        total = sum(rec.http.values())
        main = sum(n for (k, _), n in rec.http.items() if k == "main")
        print(f"\nMLflow server requests per trial: {total / trials:.1f} ({main / trials:.1f} on the driver's loop)")
        for (kind, ep), n in sorted(rec.http.items(), key=lambda kv: -kv[1]):
            print(f"  {n / trials:6.1f}  {kind:8} {ep}")
    return {"wall": wall, "trials": trials, "parts": table, "timeline": tl,
            "sql": {f"{k}/{db}": n / trials for (k, db), n in rec.sql.items()},
            "http": {f"{k} {ep}": n / trials for (k, ep), n in rec.http.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--log-models", choices=["default", "none"], default="default")
    ap.add_argument("--stores", choices=["embedded", "team"], default="embedded")
    ap.add_argument("--asha", action="store_true",
                    help="under trial_scheduler asha (rungs 1, 3, 9, ... up to --epochs, factor 3): resumes profiled too")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    os.chdir(ROOT)  # the spec's experiments/ (a bench script, not the package: chdir is fine here)
    from hpolab import cli

    rec, segs = Recorder(), trial_phases.Segments()
    for owner, attr, part, mark in targets(segs):
        rec.wrap(owner, attr, part, mark)
    count_store_traffic(rec)
    work = Path(tempfile.mkdtemp(prefix="hpolab-profile-"))
    (work / "child-marks").mkdir()
    trial_phases.install_child_marks(work / "child-marks")
    asha = [f"trial_scheduler={{type: asha, min_epochs: 1, max_epochs: {args.epochs}, reduction_factor: 3, brackets: 1}}"]
    argv_tail = ["study", "run", "studies/digits_cnn.yaml", f"n_trials={args.trials}", f"parallel={args.parallel}",
                 f"trainer.max_epochs={args.epochs}", *COMMON] + (["log_models=none"] if args.log_models == "none" else []) \
        + (asha if args.asha else [])
    print(f"{args.trials} trials x {args.epochs} epochs, parallel {args.parallel}, log_models {args.log_models}, "
          f"{args.stores} stores; {load()}", flush=True)
    with team_stores() if args.stores == "team" else contextlib.nullcontext([]) as store_args:
        t0 = time.perf_counter()
        code = cli.main(["--store", str(work / "store"), *store_args, *argv_tail])
        wall = time.perf_counter() - t0
    phases = trial_phases.timeline(segs, work / "child-marks")
    shutil.rmtree(work, ignore_errors=True)
    if code != 0 and not (args.asha and code == 1):  # (ASHA: exit 1 when no trial reached the top rung)
        sys.exit(f"trial_profile: the study exited with {code}")
    out = report(rec, args.trials, wall)
    trial_phases.print_timeline(phases)
    out["segments"] = phases
    print(f"\n{load()} at the end")
    if args.json:
        args.json.write_text(json.dumps({**vars(args), "json": str(args.json), **out, "load_end": os.getloadavg()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
