"""The kill-point harness: a driver SIGKILLed before and after each transition of the trial lifecycle,
re-run at once, and the invariants every recovery must keep.

The kill points are read from the lifecycle's transition table (hpolab.stores.trial_states.TRANSITIONS:
each transition names the study kinds whose driver passes it); the driver kills itself there
(HPOLAB_KILL_AT, study/state/lifecycle.py), so a new transition is enumerated by adding it to the table.

`enumerate_kills(kind)` runs one study kind through all its points: each run of the driver is killed
at the next point and the next run (the re-run, at once) carries on the same study; a point a run
does not reach (the study ended first) is tried again on a fresh study, after one kill mid-segment
(segment_started:after) so that the recovery points (reclaim, reaped, put_back, retry_queued) are
reachable; a point not reached even then fails the test. Every study is checked when it ends
(`assert_invariants`).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from conftest import hpolab_env, open_study, run_cli, start_cli

FAULT_PROJECT = Path(__file__).parent / "fault_project"
OWN_LOOP_PROJECT = Path(__file__).parent / "own_loop_project"
PBT = ("trial_scheduler={type: pbt, population: 2, interval_epochs: 1, quantile: 0.5, "
       "mutations: {trainer.lr: {factor: [0.8, 1.25]}}, resample_probability: 0}")
# kind -> (project, spec, overrides, study metric): tiny models and data, 2 epochs a trial
KINDS = {
    "plain": (FAULT_PROJECT, "studies/faulty.yaml", ["n_trials=2", "parallel=1", "trainer.max_epochs=2", "log_models=none",
                                                     "max_retries=3", "max_failures=null"], "val_acc"),
    "own_loop": (OWN_LOOP_PROJECT, "studies/tiny_loop.yaml", ["parallel=1", "trainer.max_epochs=2", "max_failures=null"], "val_acc"),
    # (seed 2: trials 0-2 sample hidden=16 and pause or resume, trial 3 hidden=32 is promoted as it reaches its rung)
    "asha": (FAULT_PROJECT, "studies/faulty.yaml", ["seed=2", "n_trials=4", "parallel=1", "trainer.max_epochs=2", "log_models=none",
                                                    "trial_scheduler={type: asha, min_epochs: 1, max_epochs: 2, reduction_factor: 2}"],
             "val_acc"),
    "pbt": (FAULT_PROJECT, "studies/faulty.yaml", ["parallel=1", "trainer.max_epochs=2", "log_models=none", PBT], "val_acc"),
}
# The harness's kinds are the lifecycle's study kinds, plus "own_loop": a plain study of an experiment with its
# own train(config, trial), which passes the same transitions as the routine's.
LIFECYCLE_KIND = {"own_loop": "plain"}
PREP = ("segment_started", "after")  # leaves a running trial of a dead driver: what the recovery transitions act on


def kill_points(kind: str) -> list[tuple[str, str]]:
    """Every (transition, before|after) a driver of this study kind passes, in the table's order."""
    from hpolab.stores.trial_states import TRANSITIONS

    kind = LIFECYCLE_KIND.get(kind, kind)
    return [(t.name, when) for t in TRANSITIONS if kind in t.studies for when in ("before", "after")]


@dataclass
class Run:
    point: tuple[str, str] | None
    returncode: int
    output: str
    killed_at: str | None  # the point the driver killed itself at (None: it was not killed)


@dataclass
class Report:
    kind: str
    killed: list[str] = field(default_factory=list)  # the points killed at, in order
    studies: list[str] = field(default_factory=list)  # the studies checked
    runs: int = 0
    seconds: float = 0.0
    log: list[str] = field(default_factory=list)  # each run: its study, the point asked for, where it was killed

    def add(self, name: str, run: Run) -> Run:
        self.runs += 1
        self.log.append(f"{name}: {':'.join(run.point) if run.point else 'no kill'} -> "
                        f"{'killed at ' + run.killed_at if run.killed_at else f'exit {run.returncode}'}")
        return run

    def check(self, store: Path, name: str) -> None:
        try:
            assert_invariants(store, self.kind, name)
        except AssertionError as e:
            raise AssertionError(f"{e}\nruns so far:\n" + "\n".join(self.log)) from None
        self.studies.append(name)


def start_driver(store: Path, kind: str, name: str, point: tuple[str, str] | str | None, tmp: Path, worker: bool = False,
                 extra: tuple[str, ...] = ()):
    """Start a `study run` (or `worker`) of the kind's study `name`, to be killed at `point` (None: not;
    a string: HPOLAB_KILL_AT as is). Returns (process, the file the kill point is written to)."""
    project, spec, args, _ = KINDS[kind]
    env = {**hpolab_env(), "HPOLAB_HEARTBEAT_INTERVAL": "1", "HPOLAB_GRACE_PERIOD": "4"}
    mark = tmp / f"kill-{time.monotonic_ns()}"
    if point is not None:
        env.update({"HPOLAB_KILL_AT": point if isinstance(point, str) else ":".join(point), "HPOLAB_KILL_MARK": str(mark)})
    cmd = ["worker"] if worker else ["study", "run"]
    proc = start_cli("--store", str(store), *cmd, spec, f"name={name}", *args, *extra, cwd=project, env=env,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, mark


def finish_driver(proc, mark: Path, point=None, timeout: float = 300) -> Run:
    out, _ = proc.communicate(timeout=timeout)
    return Run(point, proc.returncode, out, mark.read_text() if mark.exists() else None)


def run_driver(store: Path, kind: str, name: str, point: tuple[str, str] | None, tmp: Path, worker: bool = False,
               extra: tuple[str, ...] = ()) -> Run:
    """One `study run` (or `worker`) of the kind's study `name`, killed at `point` (None: not), to its end."""
    proc, mark = start_driver(store, kind, name, point, tmp, worker, extra)
    return finish_driver(proc, mark, point)


def assert_no_crash(run: Run) -> None:
    """Killed at its point, or ended by itself with exit 0: never a traceback, never another exit."""
    assert "Traceback" not in run.output, run.output
    if run.killed_at is not None:
        assert run.returncode in (-9, 137), (run.returncode, run.output)
    else:
        assert run.returncode == 0, (run.point, run.returncode, run.output)


def enumerate_kills(store: Path, kind: str, tmp: Path) -> Report:
    report, t0 = Report(kind), time.monotonic()
    points, number, fresh = kill_points(kind), 0, True
    name = f"{kind}-{number}"
    i = 0
    while i < len(points):
        run = report.add(name, run_driver(store, kind, name, points[i], tmp))
        assert_no_crash(run)
        if run.killed_at is not None:
            report.killed.append(run.killed_at)
            i, fresh = i + 1, False
            continue
        report.check(store, name)  # the study ended before the point: checked, then a fresh one
        assert not fresh, f"{':'.join(points[i])} is never reached in a {kind} study (even after a kill mid-segment)"
        number += 1
        name, fresh = f"{kind}-{number}", True
        prep = report.add(name, run_driver(store, kind, name, PREP, tmp))
        assert_no_crash(prep)
        assert prep.killed_at is not None, prep.output
    final = report.add(name, run_driver(store, kind, name, None, tmp))
    assert_no_crash(final)
    report.check(store, name)
    report.seconds = time.monotonic() - t0
    return report


def kills_beside_a_worker(store: Path, kind: str, tmp: Path) -> Report:
    """The kind's kill points again, each in a driver that runs beside a second worker of the same
    study (`hpolab worker`, never killed): that worker must live through every kill and end with exit 0
    and no traceback, and the stores agree when each study ends. A point the killed driver does not
    reach (the worker did that transition) is passed over: `Report.killed` says which were reached."""
    report, t0 = Report(kind), time.monotonic()
    number = 0
    name = f"{kind}-w{number}"
    worker = start_driver(store, kind, name, None, tmp, worker=True)
    for point in kill_points(kind):
        run = report.add(name, run_driver(store, kind, name, point, tmp))
        assert_no_crash(run)
        if run.killed_at is not None:
            report.killed.append(run.killed_at)
            continue
        _end_beside(report, store, name, worker)  # the study ended: its worker too, then checked
        number += 1
        name = f"{kind}-w{number}"
        worker = start_driver(store, kind, name, None, tmp, worker=True)
    report.add(name, run_driver(store, kind, name, None, tmp))
    _end_beside(report, store, name, worker)
    report.seconds = time.monotonic() - t0
    return report


def _end_beside(report: Report, store: Path, name: str, worker) -> None:
    run = finish_driver(*worker)
    report.log.append(f"{name}: the worker beside it -> exit {run.returncode}")
    assert "Traceback" not in run.output and run.returncode == 0, f"the worker beside the killed drivers: {run.output}"
    report.check(store, name)


def assert_invariants(store: Path, kind: str, name: str) -> None:
    """What every recovery keeps, checked on a study that ended (the driver exited 0)."""
    from hpolab.stores.run_roles import is_trial_run
    from hpolab.stores.trial_states import State, states

    project, _, _, metric = KINDS[kind]
    check = run_cli("--store", str(store), "study", "check", name, cwd=project, check=False)
    assert check.returncode == 0, check.stdout + check.stderr  # without --repair
    client, study = open_study(store, name)
    trials = study.get_trials()
    by_state = states(trials)
    assert not [t.number for t, s in by_state if s not in (State.COMPLETE, State.PRUNED, State.FAILED, State.RETRIED, State.RELEASED)], \
        [(t.number, s) for t, s in by_state]  # nothing left running, claimed, paused or waiting
    runs = client.search_runs([client.get_experiment_by_name(name).experiment_id], max_results=1000)
    trial_runs: dict[int, list] = {}
    for r in runs:
        if "optuna.trial_number" in r.data.tags and is_trial_run(r.data.tags):
            trial_runs.setdefault(int(r.data.tags["optuna.trial_number"]), []).append(r)
    if kind in ("asha", "pbt"):  # one Optuna trial per configuration, across pauses and kills
        assert not [t.number for t in trials if t.system_attrs.get("retry_history")], "a retry copy under a trial scheduler"
        assert all(s in (State.COMPLETE, State.PRUNED) for _, s in by_state), [(t.number, s) for t, s in by_state]
    used = 0
    for t, s in by_state:
        linked = t.user_attrs.get("mlflow_run_id")
        mine = trial_runs.get(t.number, [])
        assert [r.info.run_id for r in mine] == ([linked] if linked else []), (t.number, linked, [r.info.run_id for r in mine])
        if not linked:
            assert s in (State.RETRIED, State.RELEASED), (t.number, s)  # (an attempt whose driver died before its run)
            continue
        run = mine[0]
        assert run.data.tags.get("hpolab.state") == t.state.name and run.info.status != "RUNNING", (t.number, run.data.tags)
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, metric))
        last = max(t.intermediate_values, default=0)
        assert steps == list(range(1, len(steps) + 1)), (t.number, steps)  # 1..N: none twice, none missing
        # its last step is Optuna's last report (a retried attempt's run may have more: the epochs its
        # checkpoint held that its dead driver never reported, restored from last.pt)
        assert steps[-1:] == ([last] if last else []) or (s == State.RETRIED and len(steps) >= last), (t.number, s, steps, last)
        if s not in (State.RETRIED, State.RELEASED):
            used += steps[-1] if steps else 0
    from hpolab.stores.trial_counts import epochs_used

    assert epochs_used(trials) == used, (epochs_used(trials), used)  # the epoch budget counts what was trained
