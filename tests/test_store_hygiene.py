"""Everything a study writes lands in its store and its MLflow experiment, never in the working
directory; experiments are found from the spec's project, whatever the working directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli

SPEC = ROOT / "studies" / "digits_cnn.yaml"  # name: digits-cnn
FAULT_PROJECT = ROOT / "tests" / "fault_project"


@pytest.mark.slow
def test_study_promote_and_lr_find_write_only_to_the_store(tmp_path, store):
    """The real CLI from an unrelated working directory, with the spec in the project and the store
    in a third folder: it runs, and the working directory stays empty."""
    from mlflow import MlflowClient

    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    s = ["--store", str(store)]
    run_cli(*s, "study", "run", str(SPEC), "n_trials=2", "trainer.max_epochs=2", "parallel=1", cwd=cwd)
    # a spec path names the study (and finds its experiment); its race's trials write only to the store too
    out = run_cli(*s, "promote", str(SPEC), "--race-seeds", "2", cwd=cwd).stdout
    assert "race winner: trial" in out, out
    run_cli(*s, "lr-find", str(SPEC), "lr_range_test.num_steps=20", cwd=cwd)
    assert sorted(p.name for p in cwd.iterdir()) == []

    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    exp = client.get_experiment_by_name("digits-cnn")
    models = client.search_logged_models(experiment_ids=[exp.experiment_id])
    runs = {m.source_run_id: client.get_run(m.source_run_id) for m in models}
    trial_models = sorted((runs[m.source_run_id].info.run_name, m.name) for m in models if "-trial-" in m.name)
    assert trial_models == [("trial-0", "digits-cnn-trial-0"), ("trial-1", "digits-cnn-trial-1")]
    serving = [runs[m.source_run_id].info.run_name for m in models if m.name == "digits-cnn-v1"]  # registered model + version
    assert len(serving) == 1 and serving[0].startswith("promote-trial-"), serving
    for m in models:
        assert m.experiment_id == exp.experiment_id
        assert runs[m.source_run_id].info.experiment_id == exp.experiment_id
        assert m.artifact_location.startswith((store / "artifacts").as_uri() + "/"), m.artifact_location
        assert "READY" in str(m.status)
    # Nothing in the Default experiment, whose artifact root is inside the store too.
    assert client.search_logged_models(experiment_ids=["0"]) == []
    # The trial models are the trial runs' outputs (the MLflow UI's "Logged models" of a run).
    for m in models:
        assert m.model_id in [o.model_id for o in runs[m.source_run_id].outputs.model_outputs]


def _isolated(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Python in a fresh process (sys.modules/sys.path changes stay there)."""
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_spec_project_wins_over_an_experiments_package_imported_earlier(tmp_path):
    code = f"""
import sys
from hpolab.config.experiment import load_experiment, find_project_root
import experiments.digits_cnn                       # this repository's (a regular package)
m = load_experiment("faulty", search_from={str(FAULT_PROJECT / 'studies')!r})  # a namespace package
assert m.__file__ == {str(FAULT_PROJECT / 'experiments' / 'faulty.py')!r}, m.__file__
assert find_project_root({str(FAULT_PROJECT / 'studies' / 'faulty.yaml')!r}) == __import__("pathlib").Path({str(FAULT_PROJECT)!r})
# back to the first project: its module again, not the other root's package
d = load_experiment("digits_cnn", search_from={str(ROOT / 'studies')!r})
assert d.__file__ == {str(ROOT / 'experiments' / 'digits_cnn.py')!r}, d.__file__
# without search_from (a trial process, a command given a study name): the module already imported
assert load_experiment("digits_cnn") is d
print("ok")
"""
    out = _isolated(code, cwd=ROOT)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_an_unknown_experiment_names_where_it_looked(tmp_path):
    spec = tmp_path / "nowhere.yaml"
    spec.write_text("name: nowhere\nexperiment: no_such_experiment\n")
    out = run_cli("study", "validate", str(spec), cwd=tmp_path, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "experiment 'no_such_experiment' not found" in out.stderr
    assert f"no experiments/ folder at or above {tmp_path}" in out.stderr
    assert "working directory" in out.stderr and "import path" in out.stderr


def test_a_spec_is_validated_against_its_own_project_from_anywhere(tmp_path):
    out = run_cli("study", "validate", str(FAULT_PROJECT / "studies" / "faulty.yaml"), cwd=tmp_path)
    assert "valid" in out.stdout
    assert list(tmp_path.iterdir()) == []


def test_git_keeps_every_mlruns_folder_out():
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    if git("rev-parse", "--is-inside-work-tree").returncode != 0:
        pytest.skip("not a git checkout")
    tracked = [p for p in git("ls-files").stdout.splitlines() if "mlruns/" in p]
    assert tracked == ["mlruns/.gitkeep"]
    ignored = git("check-ignore", "--no-index", "tests/fault_project/mlruns/0/meta.yaml", "mlruns/mlflow.db", "x/y/mlruns/a").stdout.split()
    assert ignored == ["tests/fault_project/mlruns/0/meta.yaml", "mlruns/mlflow.db", "x/y/mlruns/a"]
    assert git("check-ignore", "--no-index", "mlruns/.gitkeep").returncode == 1  # not ignored
