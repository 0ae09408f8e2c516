"""Studies that travel: a study records its experiment's code (hash + `code/<module>.py` on the study,
its parent run and every trial run), so promote / reproduce / compare / report / predict work by name
from any working directory against the same store, and changed code is said (promote), refused
(reproduce, study run / worker, launch) unless --allow-code-change.

One tiny study (2 trials x 2 epochs) of an experiment in a temporary project is run once per module
and shared; tests that edit the experiment module put it back.
"""

from __future__ import annotations

import hashlib
import inspect
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, copy_store, open_study, run_cli

NAME = "travel-digits"
EXPERIMENT = "travel_digits"
RUN = ["n_trials=2", "parallel=1", "trainer.max_epochs=2", "pruner={type: none}"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _make_project(root: Path) -> Path:
    """A project outside the repository: experiments/travel_digits.py (the digits CNN) + its spec."""
    (root / "experiments").mkdir(parents=True)
    (root / "studies").mkdir()
    shutil.copy(ROOT / "experiments" / "digits_cnn.py", root / "experiments" / f"{EXPERIMENT}.py")
    spec = (ROOT / "studies" / "digits_cnn.yaml").read_text()
    spec = spec.replace("name: digits-cnn", f"name: {NAME}").replace("experiment: digits_cnn", f"experiment: {EXPERIMENT}")
    (root / "studies" / "travel.yaml").write_text(spec)
    return root


@contextmanager
def _edited(project: Path):
    """The experiment module with one more line (a real edit: its hash changes), put back after."""
    module = project / "experiments" / f"{EXPERIMENT}.py"
    before = module.read_bytes()
    module.write_bytes(before + b"\n# edited after the study ran\n")
    try:
        yield _sha(module)
    finally:
        module.write_bytes(before)


# ---- the hash / load helper (no study)


def test_recorded_code_loads_under_a_private_name_and_says_what_is_missing(tmp_path):
    from hpolab.config.experiment_code import ExperimentCode, code_filename, code_hash, code_of, load_recorded
    from hpolab.errors import UserError

    src = b"VALUE = 41\n\ndef answer():\n    return VALUE + 1\n"
    (tmp_path / "exp_mod.py").write_bytes(src)
    assert code_hash(src) == hashlib.sha256(src).hexdigest()[:16]
    assert code_filename("experiments.my_exp") == code_filename("my_exp") == "my_exp.py"

    code = ExperimentCode("my_exp", "my_exp.py", src, code_hash(src))
    m = load_recorded(code, "run abc")
    assert m.answer() == 42 and m.__name__.startswith("_hpolab_recorded_my_exp_")
    assert load_recorded(code, "run abc") is m  # loaded once per process
    assert "return VALUE + 1" in inspect.getsource(m.answer)  # tracebacks and inspect see the recorded lines

    import types

    fake = types.ModuleType("experiments.my_exp")
    fake.__file__ = str(tmp_path / "exp_mod.py")
    got = code_of(fake, "my_exp")
    assert (got.hash, got.source, got.filename, got.path) == (code.hash, src, "my_exp.py", tmp_path / "exp_mod.py")

    sibling = b"from travel_sibling_helpers import shared\n"
    with pytest.raises(UserError, match=r"imports 'travel_sibling_helpers', which is not importable here.*PYTHONPATH"):
        load_recorded(ExperimentCode("sib", "sib.py", sibling, code_hash(sibling)), "run abc")
    broken = b"raise RuntimeError('no data here')\n"
    with pytest.raises(UserError, match=r"failed to load: RuntimeError: no data here"):
        load_recorded(ExperimentCode("brk", "brk.py", broken, code_hash(broken)), "run abc")


@pytest.fixture
def _own_experiments_package():
    """In-process loads of another project's `experiments` rebind that package name: put the
    repository's back after (later tests import `experiments.digits_cnn`)."""
    import sys

    saved = {k: v for k, v in sys.modules.items() if k == "experiments" or k.startswith("experiments.")}
    path = list(sys.path)
    yield
    for k in [k for k in sys.modules if k == "experiments" or k.startswith("experiments.")]:
        del sys.modules[k]
    sys.modules.update(saved)
    sys.path[:] = path


def test_launch_records_the_code_and_refuses_another_module(tmp_path, store, _own_experiments_package):
    """`hpolab launch` on the submit host: the study records the module's hash and project; a later
    launch (or worker) with a different module is refused naming both hashes."""
    import optuna

    from hpolab.config.spec import load_spec
    from hpolab.errors import UserError
    from hpolab.launch.commands import record_code
    from hpolab.stores.paths import resolve_stores

    project = _make_project(tmp_path / "launch-project")
    spec = load_spec(project / "studies" / "travel.yaml")
    stores = resolve_stores(str(store), None, None)
    record_code(stores, spec)
    attrs = optuna.load_study(study_name=NAME, storage=f"sqlite:///{store / 'optuna.db'}").user_attrs
    module = project / "experiments" / f"{EXPERIMENT}.py"
    assert attrs["hpolab.code_hash"] == _sha(module)
    assert attrs["hpolab.project_dir"] == str(project.resolve())
    record_code(stores, spec)  # the same code again: fine
    with _edited(project) as new_hash:
        with pytest.raises(UserError) as e:
            record_code(stores, spec)
    assert attrs["hpolab.code_hash"] in str(e.value) and new_hash in str(e.value) and "--allow-code-change" in str(e.value)


# ---- one real study, shared


@pytest.fixture(scope="module")
def studied(tmp_path_factory, migrated_store):
    """(project, store, an unrelated empty working directory) after a 2-trial study run from there."""
    base = tmp_path_factory.mktemp("travel")
    project = _make_project(base / "project")
    store = base / "store"
    store.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, store / name)
    (store / "artifacts").mkdir()
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    run_cli("--store", str(store), "study", "run", str(project / "studies" / "travel.yaml"), *RUN, cwd=elsewhere)
    return project, store, elsewhere


def _trial_runs(store: Path):
    client, study = open_study(store, NAME)
    return client, study, [client.get_run(t.user_attrs["mlflow_run_id"]) for t in study.trials]


@pytest.mark.slow
def test_the_study_and_each_trial_record_the_code(studied, tmp_path):
    project, store, _ = studied
    digest = _sha(project / "experiments" / f"{EXPERIMENT}.py")
    client, study, runs = _trial_runs(store)
    assert study.user_attrs["hpolab.code_hash"] == digest
    assert study.user_attrs["hpolab.project_dir"] == str(project.resolve())
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    for run in [parent, *runs]:
        assert run.data.tags["hpolab.code_hash"] == digest
        assert run.data.tags["hpolab.code_file"] == f"code/{EXPERIMENT}.py"
        got = Path(client.download_artifacts(run.info.run_id, f"code/{EXPERIMENT}.py", str(tmp_path)))
        assert got.read_bytes() == (project / "experiments" / f"{EXPERIMENT}.py").read_bytes()


@pytest.mark.slow
def test_promote_reproduce_compare_report_predict_by_name_from_an_unrelated_folder(studied, tmp_path):
    project, store, elsewhere = studied
    s = ["--store", str(store)]
    # The race retrains in trial processes, which import the experiment: not here. Said before anything is written.
    raced = run_cli(*s, "promote", NAME, cwd=elsewhere, check=False)
    assert raced.returncode == 2 and "promote with --no-race" in raced.stderr and "Traceback" not in raced.stderr, raced.stderr
    out = run_cli(*s, "promote", NAME, "--no-race", cwd=elsewhere)
    assert "not importable here; using the code" in out.stdout, out.stdout
    assert f"registered {NAME} version 1" in out.stdout
    _, _, runs = _trial_runs(store)
    out = run_cli(*s, "reproduce", runs[0].info.run_id, cwd=elsewhere)
    assert "reproduced: identical" in out.stdout and "using the code the run recorded" in out.stdout, out.stdout
    import json

    rows = json.loads(run_cli(*s, "compare", NAME, "--format", "json", cwd=elsewhere).stdout)
    assert sorted(r["run_id"] for r in rows) == sorted(r.info.run_id for r in runs)
    run_cli(*s, "report", NAME, "--out", str(tmp_path / "r.html"), cwd=elsewhere)
    assert (tmp_path / "r.html").stat().st_size > 0

    from sklearn.datasets import load_digits

    np.save(tmp_path / "x.npy", load_digits().images[:5])
    out = run_cli(*s, "predict", f"models:/{NAME}@champion", str(tmp_path / "x.npy"), cwd=elsewhere)
    assert len(out.stdout.strip().splitlines()) == 6, out.stdout  # a header + 5 rows
    bad = run_cli(*s, "predict", "models:/no-such-model@champion", str(tmp_path / "x.npy"), cwd=elsewhere, check=False)
    assert bad.returncode == 2 and "no-such-model" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert list(elsewhere.iterdir()) == []


@pytest.mark.slow
def test_changed_code_refuses_reproduce_warns_promote_and_allow_code_change_runs(studied):
    project, store, _ = studied
    s = ["--store", str(store)]
    _, study, runs = _trial_runs(store)
    recorded = study.user_attrs["hpolab.code_hash"]
    with _edited(project) as new_hash:
        out = run_cli(*s, "reproduce", runs[1].info.run_id, cwd=project, check=False)
        assert out.returncode == 2 and recorded in out.stderr and new_hash in out.stderr, out.stderr
        assert "--allow-code-change" in out.stderr and "Traceback" not in out.stderr
        out = run_cli(*s, "reproduce", runs[1].info.run_id, "--allow-code-change", cwd=project)
        assert "reproduced: identical" in out.stdout, out.stdout  # only a comment changed
        # promote with a model name of its own (a dry run writes nothing): warns, still works
        out = run_cli(*s, "promote", NAME, "--model-name", "travel-other", "--dry-run", cwd=project)
        assert "warning" in out.stderr and recorded in out.stderr and new_hash in out.stderr, out.stderr
        assert "dry run: would register" in out.stdout


@pytest.mark.slow
def test_a_worker_with_changed_code_is_refused_unless_allowed(studied, tmp_path):
    project, store, elsewhere = studied
    store = copy_store(store, tmp_path / "store")
    spec = str(project / "studies" / "travel.yaml")
    more = [o if not o.startswith("n_trials=") else "n_trials=3" for o in RUN]
    _, study, _ = _trial_runs(store)
    recorded = study.user_attrs["hpolab.code_hash"]
    with _edited(project) as new_hash:
        out = run_cli("--store", str(store), "worker", spec, *more, cwd=elsewhere, check=False)
        assert out.returncode == 2 and recorded in out.stderr and new_hash in out.stderr, out.stderr
        assert "--allow-code-change" in out.stderr and "--new-study" in out.stderr and "Traceback" not in out.stderr
        assert len(_trial_runs(store)[1].trials) == 2  # nothing ran
        run_cli("--store", str(store), "study", "run", spec, *more, "log_models=none", "--allow-code-change", cwd=elsewhere)
    client, study, runs = _trial_runs(store)
    assert study.user_attrs["hpolab.code_hash"] == new_hash
    assert [r.data.tags["hpolab.code_hash"] for r in runs] == [recorded, recorded, new_hash]
    parent = study.user_attrs["mlflow_parent_run_id"]
    names = {a.path for a in client.list_artifacts(parent, "code")}
    assert names == {f"code/{EXPERIMENT}.py", f"code/{EXPERIMENT}-{new_hash}.py"}


@pytest.mark.slow
def test_unreadable_recorded_code_is_one_line_with_the_fix(studied, tmp_path):
    _, store, elsewhere = studied
    store = copy_store(store, tmp_path / "store")
    _, _, runs = _trial_runs(store)
    run = runs[0]
    artifact = Path(run.info.artifact_uri.removeprefix("file://")) / "code" / f"{EXPERIMENT}.py"
    artifact.unlink()
    out = run_cli("--store", str(store), "reproduce", run.info.run_id, cwd=elsewhere, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "cannot be read" in out.stderr and "--store" in out.stderr, out.stderr
