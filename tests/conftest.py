"""Shared fixtures: a temporary store per test, seeded from stores migrated once per session.

Creating an MLflow SQLite DB runs all its migrations (seconds); copying a migrated one is instant.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_store_env(monkeypatch):
    # In-process calls: --store / the test's store must decide, not a developer's exported server URLs.
    for name in ("OPTUNA_STORAGE", "MLFLOW_TRACKING_URI", "HPOLAB_STORE"):
        monkeypatch.delenv(name, raising=False)


# A stuck test: its processes' stacks, then a rerun with a timer of its own (tests/stuck_tests.py).
from stuck_tests import pytest_runtest_setup, pytest_timeout_set_timer  # noqa: E402,F401  (hooks found here)

# The suite's order (the longest modules first) and the fast tier's check (tests/suite_order.py).
from suite_order import pytest_collection_finish, pytest_collection_modifyitems, pytest_deselected  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _no_fork_allowed_after_a_test():
    # A test that runs hpolab.cli.main in this process allows the forked forkserver (as the `hpolab`
    # command does for itself) for the rest of the process: a later test's in-process driver would then
    # fork this process, threads and all. Each test starts from what a notebook gets.
    yield
    module = sys.modules.get("hpolab.study.trials.trial_forkserver")
    if module is not None:
        module._fork_allowed = False


@pytest.fixture(autouse=True)
def _repo_experiments_package():
    # A test that loads a temp project's `experiments` package leaves it in sys.modules; a later test in
    # the same process (pytest-xdist puts modules together in any order) that imports this repository's
    # `experiments.X` would then find the wrong package. Drop a foreign one after each test.
    yield
    pkg = sys.modules.get("experiments")
    paths = [str(p) for p in getattr(pkg, "__path__", [])] if pkg is not None else []
    if pkg is not None and str(ROOT / "experiments") not in paths:
        for name in [n for n in sys.modules if n == "experiments" or n.startswith("experiments.")]:
            del sys.modules[name]


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory) -> Path:
    template = tmp_path_factory.mktemp("template-store")
    from mlflow import MlflowClient
    import optuna

    from hpolab.stores.mlflow_runs import quiet_mlflow

    quiet_mlflow()
    MlflowClient(tracking_uri=f"sqlite:///{template / 'mlflow.db'}").search_experiments()
    optuna.storages.RDBStorage(f"sqlite:///{template / 'optuna.db'}")
    optuna.storages.RDBStorage(f"sqlite:///{template / 'optuna.db'}").engine.dispose()
    from hpolab.stores.sqlite_wal import use_wal

    for name in ("mlflow.db", "optuna.db"):  # as a new store's (stores/db_templates.py): its copies log ahead too
        use_wal(template / name)
    return template


@pytest.fixture
def store(tmp_path, migrated_store) -> Path:
    """A fresh store folder (mlflow.db + optuna.db already migrated) for one test."""
    d = tmp_path / "store"
    d.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, d / name)
    (d / "artifacts").mkdir()
    return d


def hpolab_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPTUNA_STORAGE", "MLFLOW_TRACKING_URI", "HPOLAB_STORE")}
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "200"
    return env


_WARM: list = []  # this process's warm interpreter (tests/warm_cli.py)


@pytest.fixture(scope="session", autouse=True)
def _host_slots_of_this_test_process(tmp_path_factory):
    """Drivers started by this pytest process (and the CLIs it runs, which inherit the environment)
    count each other's trial slots (study/trials/host_slots.py), not those of the other xdist worker's
    tests: a trial's torch threads, and so its float results, do not depend on which test ran beside it."""
    from hpolab.study.trials.host_slots import DIR_ENV

    os.environ[DIR_ENV] = str(tmp_path_factory.mktemp("host-slots"))
    yield


@pytest.fixture(scope="session", autouse=True)
def _temp_files_under_pytests_tmp(tmp_path_factory):
    """The processes this pytest process starts (commands, drivers, their forkservers and trials, the
    servers) make their temporary files under pytest's own temporary folder, which pytest prunes (it
    keeps its last three runs'). A process SIGKILLed on purpose (the kill points, the fault tests)
    cannot remove its own: multiprocessing's `pymp-*` folder of a killed driver stayed in /tmp (130
    after one full run of the suite and three fast ones)."""
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmp"))
    yield


@pytest.fixture(scope="session", autouse=True)
def _autograd_without_device_threads():
    """One backward pass in this pytest process before any test. Autograd decides once per process, at
    its first backward pass, whether to start its device threads, and starts them when a device type
    other than the CPU is registered with a device: after torch.export has run here, one is (torch 2.14,
    no GPU). With those threads started, PyTorch refuses autograd in every fork of this process
    ("Unable to handle autograd's threading in combination with fork-based multiprocessing"), and
    test_ddp and test_lr_range_outputs fork it for their ranks and children (as the product forks its
    trials from a forkserver that never trains): whether a test that exported a model ran first in the
    same process would decide whether they pass."""
    import torch

    x = torch.zeros(1, requires_grad=True)
    (x * 2).sum().backward()
    yield


@pytest.fixture(scope="session", autouse=True)
def _warm_cli(_temp_files_under_pytests_tmp):
    # Started before the first test (its imports overlap the first tests), not by the first run_cli: a
    # test that compares the processes alive before and after a command would count it as left behind.
    if os.environ.get("HPOLAB_TEST_FRESH_CLI") != "1":
        from warm_cli import WarmCli

        _WARM.append(WarmCli(hpolab_env(), ROOT))
    yield
    while _WARM:
        _WARM.pop().stop()


def _command_line(args) -> list[str]:
    exe = Path(sys.executable).with_name("hpolab")
    return [str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else ["-m", "hpolab.cli"]), *args]


def run_cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 600, check: bool = True):
    """Run the real `hpolab` console script (the one the README tells users to run) to its end.

    It runs in a fork of a warm interpreter that has imported torch, MLflow and Optuna already
    (tests/warm_cli.py says what that changes and why it is safe); HPOLAB_TEST_FRESH_CLI=1 starts a
    new interpreter for every command instead."""
    cmd = _command_line(args)
    if os.environ.get("HPOLAB_TEST_FRESH_CLI") == "1":
        proc = subprocess.run(cmd, cwd=cwd, env=env or hpolab_env(), capture_output=True, text=True, timeout=timeout)
    else:
        proc = _WARM[0].run(cmd, cwd=cwd, env=env or hpolab_env(), timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"hpolab {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def start_cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, **popen):
    """Start the real `hpolab` console script, as subprocess.Popen([hpolab, *args], **popen) would.

    Through the warm interpreter, as run_cli (the returned object has the pid, stdout, stderr, poll,
    wait, communicate, send_signal, terminate and kill of a Popen); HPOLAB_TEST_FRESH_CLI=1 gives a
    subprocess.Popen. Tests that inspect the command's process image (its command line) use Popen."""
    cmd = _command_line(args)
    if os.environ.get("HPOLAB_TEST_FRESH_CLI") == "1":
        return subprocess.Popen(cmd, cwd=cwd, env=env or hpolab_env(), **popen)
    return _WARM[0].start(cmd, cwd=cwd, env=env or hpolab_env(), **popen)


@contextlib.contextmanager
def storage_proxy(database: str, cwd: Path):
    """`hpolab storage-proxy` in front of `database` on a free loopback port: yields its grpc:// URL, then
    stops it with SIGTERM (as docker stop does) and, when the body passed, asserts it stopped cleanly."""
    from services import free_port

    port = free_port()
    proxy = start_cli("--storage", database, "storage-proxy", "--port", str(port), cwd=cwd,
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert "storage proxy" in proxy.stdout.readline()
        yield f"grpc://127.0.0.1:{port}"
    finally:
        proxy.send_signal(signal.SIGTERM)
        tail = proxy.communicate(timeout=60)[0]
    assert proxy.returncode == 0 and "storage proxy stopped" in tail, tail


def live_processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, command line) of every live (not zombie) process, from /proc."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:  # it ended meanwhile
            continue
        if fields[0] != "Z":
            found[int(stat.parent.name)] = (int(fields[1]), int(fields[2]), cmdline)
    return found


# ---- a shared study with COMPLETE, FAIL and PRUNED trials (compare, report, UI tests)

STUDY = "cmp-tiny"
SPEC = ["studies/digits_cnn.yaml", f"name={STUDY}", "parallel=2", "trainer.max_epochs=3", "sampler.kwargs={n_startup_trials: 2}"]
_TEMPLATE: dict[str, Path] = {}


def mixed_study_template(tmp_path_factory, migrated_store: Path) -> Path:
    """A store holding study `cmp-tiny`: trials 0-1 COMPLETE, 2 FAIL (NaN injected), 3 PRUNED.

    Built once per test run (three `study run`s, about half a minute on 2 cores) and shared: treat it
    as read-only. Under pytest-xdist the first worker that needs it builds it in the run's shared
    temporary folder while the others wait on a lock, then all read that one.
    """
    if "store" not in _TEMPLATE:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            shared = tmp_path_factory.getbasetemp().parent  # this run's folder, above each worker's own
            with (shared / "mixed-study.lock").open("w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (shared / "mixed-study" / "built").exists():
                    shutil.rmtree(shared / "mixed-study", ignore_errors=True)  # a build that failed in another worker
                    _build_mixed_study(shared / "mixed-study" / "store", migrated_store)
                    (shared / "mixed-study" / "built").touch()
            _TEMPLATE["store"] = shared / "mixed-study" / "store"
        else:
            _TEMPLATE["store"] = _build_mixed_study(tmp_path_factory.mktemp("mixed-study") / "store", migrated_store)
    return _TEMPLATE["store"]


def _build_mixed_study(store: Path, migrated_store: Path) -> Path:
    store.mkdir(parents=True)
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, store / name)
    (store / "artifacts").mkdir()
    s = ["--store", str(store), "study", "run", *SPEC]
    env = {**hpolab_env(), "HPOLAB_SYSTEM_METRICS_INTERVAL": "0.5"}  # (tiny trials: a few system metrics samples each)
    run_cli(*s, "n_trials=2", "pruner={type: none}", env=env)
    # NaN loss at micro-step 2 -> the trial fails with a reason, before any epoch ends.
    # (Changing trainer/pruner values of a study needs --allow-spec-change: they change what a trial means.)
    run_cli(*s, "n_trials=3", "trainer.inject_nan_at_step=2", "pruner={type: none}", "--allow-spec-change", env=env)
    # ThresholdPruner: val_acc below 0.99 after epoch 1 (a 3-epoch digits CNN never reaches it) -> pruned.
    run_cli(*s, "n_trials=4", "pruner={type: threshold, kwargs: {lower: 0.99}}", "--allow-spec-change", env=env)
    return store


def copy_store(src: Path, dst: Path) -> Path:
    """Copy a store and re-point MLflow's absolute artifact paths at the copy.

    mlflow.db records each experiment's artifact_location and each run's artifact_uri as absolute
    paths; a plain copy would keep writing artifacts into the original.
    """
    shutil.copytree(src, dst)
    con = sqlite3.connect(dst / "mlflow.db")
    with con:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for t in tables:
            for _, col, typ, *_ in con.execute(f'PRAGMA table_info("{t}")').fetchall():
                if any(k in (typ or "").upper() for k in ("CHAR", "TEXT", "CLOB")) or not typ:
                    con.execute(f'UPDATE "{t}" SET "{col}" = replace("{col}", ?, ?) WHERE "{col}" LIKE ?',
                                (str(src), str(dst), f"%{src}%"))
    con.close()
    return dst


@pytest.fixture(scope="module")
def template(tmp_path_factory, migrated_store) -> Path:
    """The shared mixed-state study (read-only; copy_store it before writing)."""
    return mixed_study_template(tmp_path_factory, migrated_store)


# ---- the fault project (tests/fault_project): an experiment that misbehaves on request

FAULT_PROJECT = Path(__file__).parent / "fault_project"
FAULT_SPEC = "studies/faulty.yaml"


def open_study(store: Path, name: str = "faulty"):
    """(MlflowClient, optuna.Study) of a study in an embedded store."""
    import optuna
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{store / 'optuna.db'}")
    return client, study


def wait_for_checkpoints(store: Path, n: int, timeout: float = 120, study: str = "faulty") -> None:
    """Wait until `n` trials of the study have written their first checkpoint (they are mid-training)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(list((store / "trials" / study).glob("trial-*/last.pt"))) >= n:
            return
        time.sleep(0.1)
    raise AssertionError("no trial checkpointed in time")


def trial_run(t, client):
    """The MLflow run of an Optuna trial."""
    return client.get_run(t.user_attrs["mlflow_run_id"])

@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: one intra-op thread is the fastest and steadiest setting on a small shared box
    (a module uses it with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)



def metric_steps(client, run_id: str, metric: str) -> list[int]:
    """The epochs (steps) at which a run logged `metric`, in order."""
    return sorted(m.step for m in client.get_metric_history(run_id, metric))


def assert_study_check_clean(store: Path, study: str, cwd: Path = ROOT) -> None:
    out = run_cli("--store", str(store), "study", "check", study, cwd=cwd, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def assert_sigterm_then_rerun_resumes(store: Path, spec: str, study: str, args: list[str], metric: str, epochs: int) -> None:
    """SIGTERM a study while two trials train (exit 143), run the same command again: each retried
    trial is COMPLETE, went on from its checkpoint's epoch, and its run has one continuous curve of
    `metric` over epochs 1..`epochs`; `study check` is clean."""
    driver = start_cli("--store", str(store), "study", "run", spec, *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_checkpoints(store, 2, study=study)  # both trials are mid-training
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == 143, out
    run_cli("--store", str(store), "study", "run", spec, *args)  # the same command again: resume

    client, opened = open_study(store, study)
    retries = [t for t in opened.get_trials() if t.system_attrs.get("retry_history")]
    assert retries and all(t.state.name == "COMPLETE" for t in retries), out
    for t in retries:
        run = trial_run(t, client)
        assert int(run.data.tags["hpolab.resumed_after_epoch"]) >= 1  # it went on from the restored checkpoint
        assert metric_steps(client, run.info.run_id, metric) == list(range(1, epochs + 1))  # one continuous curve
    assert_study_check_clean(store, study)


def bench_script(name: str):
    """A bench/ script loaded as a module (bench/ is no package): its pure parts, tested without training."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).resolve().parents[1] / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
