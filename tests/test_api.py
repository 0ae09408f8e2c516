"""The Python API (`hpolab.run_study`, `hpolab.load_study`, Study, `hpolab.predict`) against the CLI it
mirrors: the same checks, the same tables, the same stores.

Calls that run a study or write to MLflow run in a script of their own (as a user's script would: a
real interpreter, its own signal handlers and main module); reads run in this process, the
environment restored by the API itself (MLflow's set_tracking_uri exports MLFLOW_TRACKING_URI).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, STUDY, copy_store, hpolab_env, run_cli

HEAVY = ("torch", "mlflow", "optuna", "pandas")


def run_script(code: str, tmp_path: Path, cwd: Path = ROOT, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """`code` as a user's script file (python script.py): its exit code, stdout, stderr."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    env = {**hpolab_env(), "PYTHONPATH": str(ROOT / "platform")}
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"script exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def last_json(stdout: str):
    return json.loads(stdout.strip().splitlines()[-1])


def test_import_hpolab_is_light_and_reaches_the_api_lazily():
    code = ("import sys, hpolab; before = [m for m in %r if m in sys.modules]\n"
            "names = [n for n in ('run_study', 'load_study', 'lr_find', 'predict', 'Study') if callable(getattr(hpolab, n))]\n"
            "after = [m for m in %r if m in sys.modules]\n"
            "try:\n    hpolab.no_such_name\nexcept AttributeError as e:\n    missing = str(e)\n"
            "import json; print(json.dumps([before, names, after, missing]))") % (HEAVY, HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "platform")}).stdout
    before, names, after, missing = json.loads(out)
    assert before == [] and after == []  # the API's names resolve without torch, MLflow, Optuna or pandas
    assert names == ["run_study", "load_study", "lr_find", "predict", "Study"]
    assert "no_such_name" in missing


BAD = {"name": "api-bad", "experiment": "digits_cnn", "n_trials": 0, "trainer": {"max_epochs": 1, "nope": 3}}
# valid keys, but the experiment (found from the working directory) has no model.width
BAD_FOR_THE_EXPERIMENT = {"name": "api-bad", "experiment": "digits_cnn", "search_space": {"model.width": {"type": "int", "low": 1, "high": 4}}}


def test_a_dict_spec_fails_with_the_same_spec_errors_as_the_file(store, tmp_path):
    import yaml

    import hpolab
    from hpolab.errors import SpecError

    with pytest.raises(SpecError) as from_dict:
        hpolab.run_study(BAD, store=store, progress=False)
    problems = from_dict.value.problems
    assert any(p.startswith("n_trials: ") for p in problems), problems
    assert any(p.startswith("trainer.nope: unknown key") for p in problems), problems
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(yaml.safe_dump(BAD))
    with pytest.raises(SpecError) as from_file:
        hpolab.run_study(spec_file, store=store, progress=False)
    assert from_file.value.problems == problems
    with pytest.raises(SpecError, match="search_space.model.width: model has no key 'width'"):
        hpolab.run_study(BAD_FOR_THE_EXPERIMENT, store=store, progress=False)
    # overrides as a dict are the command line's key=value: a bad one is named the same way
    with pytest.raises(SpecError) as overridden:
        hpolab.run_study("studies/digits_cnn.yaml", {"trainer.max_epochs": 0}, store=store, progress=False)
    cli = run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", "trainer.max_epochs=0", check=False)
    assert cli.returncode == 2 and overridden.value.render() in cli.stderr
    assert "MLFLOW_TRACKING_URI" not in os.environ
    assert not list(store.glob("trials/*"))  # nothing written


def test_load_study_of_an_unknown_name_is_a_user_error(store):
    import hpolab
    from hpolab.errors import UserError

    with pytest.raises(UserError, match="no study named 'nope'"):
        hpolab.load_study("nope", store=store)
    with pytest.raises(UserError, match="state='done': use one of complete, pruned, fail, all"):
        hpolab.api.study.Study("nope", hpolab.api.stores.open_stores(store)).trials_df(state="done")
    assert run_cli("--store", str(store), "compare", "nope", check=False).returncode == 2


@pytest.mark.slow
def test_run_study_from_a_dict_and_a_path_in_a_script(store, tmp_path):
    # A script as users write it: no `if __name__ == "__main__":` (trials never import it), the
    # second study run from a thread (no signal handlers there: it says so and runs).
    out = run_script(f"""
        import json, os, threading
        import hpolab

        forks = []
        os.register_at_fork(before=lambda: forks.append(os.getpid()))
        spec = {{"name": "api-dict", "experiment": "digits_cnn", "n_trials": 2, "parallel": 2, "log_models": "complete",
                "trainer": {{"max_epochs": 1}}, "search_space": {{"trainer.lr": {{"type": "float", "low": 1e-3, "high": 1e-2, "log": True}}}}}}
        a = hpolab.run_study(spec, store={str(store)!r})
        results = {{}}
        def in_thread():
            results["b"] = hpolab.run_study("studies/digits_cnn.yaml", {{"name": "api-path", "n_trials": 1, "parallel": 1,
                                            "trainer.max_epochs": 1}}, store={str(store)!r}, progress=False)
        t = threading.Thread(target=in_thread)
        t.start(); t.join()
        b = results["b"]
        print(json.dumps([a.name, len(a.trials_df()), b.name, list(b.trials_df()["state"]), os.environ.get("MLFLOW_TRACKING_URI"), forks]))
    """, tmp_path)
    name_a, rows_a, name_b, states_b, env_after, forks = last_json(out.stdout)
    assert (name_a, rows_a, name_b, states_b) == ("api-dict", 2, "api-path", ["COMPLETE"])
    assert env_after is None  # the caller's environment as it was
    assert forks == []  # nothing forked the script's process: trials come from the forkserver
    assert "study api-dict" in out.stdout and "trial 1 COMPLETE" in out.stdout  # progress=True: the CLI's lines
    assert out.stderr.count("not the main thread") == 1
    for name in ("api-dict", "api-path"):
        assert run_cli("--store", str(store), "study", "check", name, check=False).returncode == 0


@pytest.fixture(scope="module")
def mixed(template, tmp_path_factory) -> Path:
    """A writable copy of the shared study with COMPLETE, FAIL and PRUNED trials (conftest)."""
    return copy_store(template, tmp_path_factory.mktemp("api-mixed") / "store")


@pytest.mark.slow
def test_trials_df_is_what_compare_prints_as_csv(mixed):
    import hpolab

    study = hpolab.load_study(STUDY, store=mixed)
    cli = run_cli("--store", str(mixed), "compare", STUDY, "--format", "csv").stdout
    df = study.trials_df()
    assert list(df.columns) == list(pd.read_csv(io.StringIO(cli)).columns)
    assert df.to_csv(index=False) == cli  # the same rows, order and values
    assert sorted(df["state"]) == ["COMPLETE", "COMPLETE", "FAIL", "PRUNED"]
    top = run_cli("--store", str(mixed), "compare", STUDY, "--format", "csv", "--state", "complete", "--top", "1").stdout
    assert study.trials_df(state="complete", top=1).to_csv(index=False) == top
    assert "MLFLOW_TRACKING_URI" not in os.environ


@pytest.mark.slow
def test_best_check_and_report_of_a_loaded_study(mixed, tmp_path):
    import hpolab
    from hpolab.errors import UserError

    study = hpolab.load_study(STUDY, store=mixed)
    rows = json.loads(run_cli("--store", str(mixed), "compare", STUDY, "--format", "json", "--state", "complete").stdout)
    best = study.best
    assert best.number == rows[0]["trial"] and best.value == rows[0]["best_val_acc"] and best.metric == "val_acc"
    assert best.params == {k.removeprefix("params."): v for k, v in rows[0].items() if k.startswith("params.")}
    assert best.run_id == rows[0]["run_id"] and best.model_uri == rows[0]["model_uri"]
    assert study.check() == []
    assert run_cli("--store", str(mixed), "study", "check", STUDY).returncode == 0
    path = study.report(tmp_path / "r.html")
    assert path == tmp_path / "r.html" and "<html" in path.read_text()[:500].lower()
    with pytest.raises(UserError, match="one objective"):
        study.front()
    assert "MLFLOW_TRACKING_URI" not in os.environ


@pytest.mark.slow
def test_best_and_front_of_a_study_of_two_objectives(store):
    import hpolab

    run_cli("--store", str(store), "study", "run", "studies/digits_pareto.yaml", "n_trials=4", "parallel=2",
            "trainer.max_epochs=1", "pruner={type: none}", "log_models=none")
    study = hpolab.load_study("studies/digits_pareto.yaml", store=store)  # (a spec file names its study)
    rows = json.loads(run_cli("--store", str(store), "compare", "digits-pareto", "--format", "json").stdout)
    on_front = [r["trial"] for r in rows if r["front"] in ("yes", "knee")]
    front = study.front()
    assert list(front["trial"]) == on_front and len(front) >= 1
    assert set(front.columns) == set(rows[0])
    # Optuna's own Pareto front (every trial here is feasible: the digits CNN is far under the size bound)
    import optuna

    trials = optuna.load_study(study_name="digits-pareto", storage=f"sqlite:///{store / 'optuna.db'}").best_trials
    assert sorted(t.number for t in trials) == sorted(on_front)
    best = study.best
    assert best.number == rows[0]["trial"] and rows[0]["rank"] == 1
    assert set(best.values) == {"val_acc", "latency_ms"} and best.values["latency_ms"] == rows[0]["objective.latency_ms"]


@pytest.mark.slow
def test_promote_and_predict_from_a_script_match_the_cli(store, tmp_path):
    out = run_script(f"""
        import json
        import numpy as np
        from sklearn.datasets import load_digits
        import hpolab

        study = hpolab.run_study("studies/digits_cnn.yaml", ["name=api-promote", "n_trials=2", "trainer.max_epochs=1",
                                 "log_models=complete"], store={str(store)!r}, progress=False)
        p = study.promote(race=False)
        x = load_digits().images[:3]
        np.save({str(tmp_path / "x.npy")!r}, x)
        table = hpolab.predict(p.model_uri, x, store={str(store)!r})
        import torch
        from_tensor = hpolab.predict(p.model_uri, torch.from_numpy(x[0]), store={str(store)!r})
        print(json.dumps([p.exit_code, p.promoted, p.refused, p.version, p.model_uri, table.to_csv(sep="\\t", index=False),
                          list(from_tensor.columns), len(from_tensor), study.best.number]))
    """, tmp_path)
    code, promoted, refused, version, uri, table, tensor_columns, tensor_rows, best = last_json(out.stdout)
    assert (code, promoted, refused, uri) == (0, True, False, "models:/api-promote@champion")
    from mlflow import MlflowClient

    mv = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}").get_model_version_by_alias("api-promote", "champion")
    assert mv.version == version and mv.tags["hpolab.trial_number"] == str(best)
    cli = run_cli("--store", str(store), "predict", uri, str(tmp_path / "x.npy")).stdout
    assert table == cli  # the same rows and columns as `hpolab predict` prints
    frame = pd.read_csv(io.StringIO(table), sep="\t")
    assert len(frame) == 3 and list(frame.columns[:3]) == ["input", "class", "label"]
    assert tensor_columns == list(frame.columns) and tensor_rows == 1
    # promote again: nothing to do (the challenger holds the alias), the CLI's exit code 0
    again = run_script(f"""
        import hpolab
        from hpolab.errors import UserError
        study = hpolab.load_study("api-promote", store={str(store)!r})
        p = study.promote(race=False)
        try:
            study.promote(alias="latest")
        except UserError as e:
            print("refused alias:", e)
        print(p.exit_code, p.promoted, p.version)
    """, tmp_path).stdout
    assert again.strip().endswith(f"0 True {version}") and "refused alias: --alias 'latest'" in again
    assert run_cli("--store", str(store), "promote", "--no-race", "api-promote", "--alias", "latest", check=False).returncode == 2


@pytest.mark.slow
def test_lr_find_from_a_script_logs_what_the_command_logs(store, tmp_path):
    out = run_script(f"""
        import json
        import hpolab

        r = hpolab.lr_find({{"name": "api-lr", "experiment": "digits_cnn", "lr_range_test": {{"num_steps": 30}}}},
                           out={str(tmp_path / "lr")!r}, store={str(store)!r})
        print(json.dumps([r.suggestion, str(r.plot), str(r.csv), r.run_id, len(r.result.lrs)]))
    """, tmp_path)
    suggestion, plot, csv, run_id, steps = last_json(out.stdout)
    assert "plot: " + plot in out.stdout  # the command's lines
    assert Path(plot).stat().st_size > 10_000 and Path(csv).read_text().startswith("step,lr,loss,smoothed_loss")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.run_name == "lr-range-test" and client.get_experiment(run.info.experiment_id).name == "api-lr"
    assert suggestion is None or float(run.data.params["suggestion"]) == pytest.approx(suggestion)
    assert 5 <= steps <= 30


@pytest.mark.slow
def test_a_study_the_cli_exits_1_on_raises_study_error_with_its_line(store, tmp_path):
    # every trial fails (a NaN loss at its first step): `study run` exits 1, run_study raises StudyError, one line each
    args = ["n_trials=1", "parallel=1", "trainer.max_epochs=1", "trainer.inject_nan_at_step=1", "log_models=none"]
    cli = run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", "name=api-fail-cli", *args, check=False)
    assert cli.returncode == 1
    out = run_script(f"""
        import hpolab
        from hpolab.errors import StudyError
        try:
            hpolab.run_study("studies/digits_cnn.yaml", ["name=api-fail"] + {args!r}, store={str(store)!r}, progress=False)
        except StudyError as e:
            print("StudyError:", e)
    """, tmp_path)
    line = [x for x in cli.stderr.splitlines() if x.startswith("hpolab: ")][-1]
    assert out.stdout.strip() == "StudyError: " + line.removeprefix("hpolab: ")


def test_a_dict_spec_finds_its_experiment_in_project_dir(store, tmp_path):
    import hpolab
    from hpolab.errors import SpecError

    project = tmp_path / "project"
    (project / "experiments").mkdir(parents=True)
    (project / "experiments" / "api_probe.py").write_text(
        "MODEL_DEFAULTS = {'width': 8}\nDATA_DEFAULTS = {}\n"
        "def load_data(cfg, seed): ...\ndef build_model(cfg, input_shape, num_classes): ...\n")
    spec = {"name": "api-project", "experiment": "api_probe", "model": {"nope": 1}}
    with pytest.raises(SpecError) as missing:  # the working directory, this repository, has no such experiment
        hpolab.run_study(spec, store=store, progress=False)
    assert missing.value.problems[0].startswith("experiment: ")
    with pytest.raises(SpecError) as found:  # found in the project: its MODEL_DEFAULTS are checked
        hpolab.run_study(spec, store=store, project_dir=project, progress=False)
    assert "model.nope: unknown key for experiment api_probe (known: width)" in found.value.problems


def test_dict_overrides_take_numpy_values_and_name_a_key_they_cannot_write():
    import numpy as np

    from hpolab.api.specs import override_strings
    from hpolab.errors import UserError

    # what a notebook's own search hands over: numpy scalars read back as the numbers they are
    assert override_strings({"n_trials": np.int64(4), "trainer.lr": np.float64(0.25), "model.sizes": np.array([8, 16])}) == [
        "n_trials=4", "trainer.lr=0.25", "model.sizes=[8, 16]"]
    with pytest.raises(UserError, match="override 'model.fn'"):
        override_strings({"model.fn": print})


def test_run_study_with_an_int_for_its_overrides_says_what_overrides_are(store):
    import hpolab
    from hpolab.errors import UserError

    with pytest.raises(UserError, match=r"overrides: 5 \(int\) is neither a dict .* run_study\(spec, \{'n_trials': 5\}\)"):
        hpolab.run_study("studies/digits_cnn.yaml", 5, store=store, progress=False)


def test_a_store_that_is_a_file_is_one_user_error_from_the_api(tmp_path):
    import hpolab
    from hpolab.errors import UserError

    file = tmp_path / "notes.txt"
    file.write_text("not a store")
    with pytest.raises(UserError, match="is a file, not a folder"):
        hpolab.run_study("studies/digits_cnn.yaml", {"n_trials": 1}, store=file, progress=False)
    assert file.read_text() == "not a store"


@pytest.mark.slow
def test_a_script_that_edits_its_experiment_between_two_studies_runs_and_records_the_edited_code(store, tmp_path):
    """One process, three studies: the forkserver is kept while the experiment's file is unchanged (the
    second study starts at once) and replaced when it changed, and the driver imports the file again:
    the third study's trial runs the edited code, which is the code its runs record. Before, the
    trials of every later study ran the first version while the runs recorded the edited one. The
    edit keeps the file's size and lands within the same second (Python's bytecode cache would hold
    the old code: the edit's mtime is set to the first version's)."""
    project = tmp_path / "project"
    (project / "experiments").mkdir(parents=True)
    (project / "studies").mkdir()
    spec = (ROOT / "studies" / "digits_own_loop.yaml").read_text().replace("experiment: digits_own_loop", "experiment: mine")
    (project / "studies" / "s.yaml").write_text(spec)
    source = (ROOT / "experiments" / "digits_own_loop.py").read_text()
    out = run_script(f"""
        import hashlib, json, os, pathlib, sys
        from multiprocessing import forkserver
        import hpolab

        sys.dont_write_bytecode = False  # (PYTHONDONTWRITEBYTECODE may be set) bytecode cached, as for most users

        source, experiment, seen = {source!r}, pathlib.Path("experiments/mine.py"), []
        for i, version in enumerate("AAB"):
            experiment.write_text(source.replace("def train(config: dict, trial) -> None:\\n",
                                  f"def train(config: dict, trial) -> None:\\n    print('code version {{version}}', flush=True)\\n", 1))
            written = written if i else experiment.stat().st_mtime_ns
            os.utime(experiment, ns=(written, written))  # each edit as if in the same second as the first
            hpolab.run_study("studies/s.yaml", {{"name": f"edited-{{i}}", "n_trials": 1, "parallel": 1, "trainer.max_epochs": 1,
                             "log_models": "none"}}, store={str(store)!r})
            seen.append([forkserver._forkserver._forkserver_pid, hashlib.sha256(experiment.read_bytes()).hexdigest()[:16]])
        print(json.dumps(seen))
    """, tmp_path, cwd=project)
    (pid_a, hash_a), (pid_a2, hash_a2), (pid_b, hash_b) = last_json(out.stdout)
    assert pid_a == pid_a2 != pid_b and hash_a == hash_a2 != hash_b
    trial_lines = [line for line in out.stdout.splitlines() if line.startswith("trial 0 | code version")]
    assert trial_lines == ["trial 0 | code version A", "trial 0 | code version A", "trial 0 | code version B"], out.stdout
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}/mlflow.db")
    for name, expected in (("edited-1", hash_a), ("edited-2", hash_b)):
        runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
        assert {r.data.tags["hpolab.code_hash"] for r in runs} == {expected}, name  # the parent run and the trial's
