"""An experiment's own training loop (`train(config, trial)`) through the real CLI.

tests/own_loop_project/experiments/tiny_loop.py is a loop whose metrics the test decides (a real tiny
model, milliseconds per epoch): its runs must look like the routine's (state tags, per-epoch metrics,
checkpoints, logged models, `study check` clean), a trial whose reports miss the study metric fails
with one line, and what only the routine can do is refused when the spec loads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import ROOT, open_study, run_cli, trial_run

PROJECT = Path(__file__).parent / "own_loop_project"
SPEC = "studies/tiny_loop.yaml"
STUDY = "tiny-loop"


def _run(store: Path, *args: str, check: bool = True):
    return run_cli("--store", str(store), "study", "run", SPEC, *args, cwd=PROJECT, check=check)


def _history(client, run_id: str, metric: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, metric))


def _checkpoints(client, run_id: str) -> list[str]:
    return sorted(Path(a.path).name for a in client.list_artifacts(run_id, "checkpoints"))


def test_pruned_and_complete_trials_are_logged_like_the_routines(store):
    out = _run(store, "model.amp=bf16")
    client, study = open_study(store, STUDY)
    by_quality = {t.params["model.quality"]: t for t in study.get_trials()}
    done, pruned = by_quality[0.9], by_quality[0.1]
    assert done.state == TrialState.COMPLETE and pruned.state == TrialState.PRUNED, out.stdout
    assert done.value == pytest.approx(0.9) and done.intermediate_values == pytest.approx({1: 0.3, 2: 0.6, 3: 0.9})

    run = trial_run(done, client)
    tags = run.data.tags
    assert run.info.status == "FINISHED" and tags["hpolab.state"] == "COMPLETE"
    assert tags["hpolab.best_epoch"] == "3" and tags["hpolab.epochs_run"] == "3" and tags["hpolab.stop_reason"] == "max_epochs"
    assert tags["hpolab.device"] == "cpu" and run.data.params["model.quality"] == "0.9"
    assert tags["hpolab.amp"] == "bf16"  # what the loop told trial.describe
    assert [s for s, _ in _history(client, run.info.run_id, "val_acc")] == [1, 2, 3]
    assert [v for _, v in _history(client, run.info.run_id, "steps")] == [1, 2, 3]
    assert tags["hpolab.checkpoint_epoch"] == "3"  # last.pt uploaded while it ran (then deleted: it finished)
    assert _checkpoints(client, run.info.run_id) == ["best.pt"] and "hpolab.last_checkpoint" in tags

    import mlflow.pyfunc
    import numpy as np

    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model(tags["hpolab.model_uri"])  # the copy train() gave trial.log_model
    assert model.metadata.signature is not None
    assert np.asarray(model.predict(np.ones((3, 4), dtype=np.float32))).shape == (3, 2)

    prun = trial_run(pruned, client)
    assert prun.info.status == "KILLED" and prun.data.tags["hpolab.state"] == "PRUNED"
    assert prun.data.tags["hpolab.pruned_at_epoch"] == "1" and prun.data.tags["hpolab.stop_reason"] == "stopped_by_caller"
    assert [s for s, _ in _history(client, prun.info.run_id, "val_acc")] == [1]
    assert "hpolab.model_uri" not in prun.data.tags

    check = run_cli("--store", str(store), "study", "check", STUDY, cwd=PROJECT, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_reports_without_the_study_metric_fail_the_trial_with_one_line(store):
    out = _run(store, "n_trials=1", "model.metric_name=accuracy", "search_space={}", "sampler={type: random}", check=False)
    client, study = open_study(store, STUDY)
    (t,) = study.get_trials()
    assert t.state == TrialState.FAIL, out.stdout
    reason = trial_run(t, client).data.tags["hpolab.fail_reason"]
    assert reason == ("the reports never carried the study metric val_acc; they carried: accuracy, opt_lr, start_epoch, steps, "
                      "train_loss (report val_acc, or set the spec's metric: to one of these)")
    assert reason in " ".join(out.stdout.split())  # (the console wraps long lines)


@pytest.mark.slow
def test_an_exception_in_train_fails_that_trial_only(store):
    out = _run(store, "n_trials=2", "sampler={type: grid}", "pruner={type: none}",
               "search_space={model.raise_at: {type: categorical, choices: [0, 2]}}", check=False)
    client, study = open_study(store, STUDY)
    by_raise = {t.params["model.raise_at"]: t for t in study.get_trials()}
    assert by_raise[0].state == TrialState.COMPLETE, out.stdout
    failed = trial_run(by_raise[2], client)
    assert by_raise[2].state == TrialState.FAIL and failed.data.tags["hpolab.fail_kind"] == "exception"
    assert failed.data.tags["hpolab.fail_reason"] == "RuntimeError: the loop raised on purpose at epoch 2"
    assert [s for s, _ in _history(client, failed.info.run_id, "val_acc")] == [1]


@pytest.mark.slow
def test_a_trial_that_logs_no_model_says_why(store):
    _run(store, "n_trials=1", "model.log_model=false", "search_space={}", "sampler={type: random}")
    client, study = open_study(store, STUDY)
    (t,) = study.get_trials()
    tags = trial_run(t, client).data.tags
    assert t.state == TrialState.COMPLETE
    assert tags["hpolab.model_skipped"] == "train() logged no model (call trial.log_model(model, input_example))"
    assert "hpolab.model_uri" not in tags and "hpolab.model_error" not in tags
    check = run_cli("--store", str(store), "study", "check", STUDY, cwd=PROJECT, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.slow
def test_a_model_its_process_cannot_export_is_an_error_not_a_rebuild(store):
    _run(store, "n_trials=1", "model.log_model=unexportable", "search_space={}", "sampler={type: random}")
    client, study = open_study(store, STUDY)
    (t,) = study.get_trials()
    tags = trial_run(t, client).data.tags
    assert t.state == TrialState.COMPLETE  # the result stands
    assert tags["hpolab.model_error"].startswith("its process could not save the model (")
    assert tags["hpolab.model_error"].endswith("; no model is logged (an own training loop's model is only in its process)")
    assert "hpolab.model_uri" not in tags


EXAMPLE = "studies/digits_own_loop.yaml"  # experiments/digits_own_loop.py declares METRIC_DIRECTIONS


@pytest.mark.parametrize("args, line", [
    (["study", "validate", EXAMPLE, "metric=val_f1"],
     "metric: 'val_f1' is not in the METRIC_DIRECTIONS of experiment digits_own_loop (declared: val_acc, val_loss); "
     "use one of them or declare it there"),
    (["study", "validate", EXAMPLE, "direction=minimize"],
     "direction: val_acc should be maximized (METRIC_DIRECTIONS of experiment digits_own_loop); set direction: maximize"),
    (["study", "validate", EXAMPLE, "trainer.devices=2"],
     "trainer.devices: 2 needs the platform's routine (DDP ranks); an own training loop (train(config, trial)) runs in "
     "one process on one device: set trainer.devices: 1"),
    (["study", "validate", EXAMPLE, "lr_range_test.enabled=true"],
     "lr_range_test.enabled: the LR range test needs build_model/load_data (the platform's routine); an own training "
     "loop (train(config, trial)) has none: set lr_range_test.enabled: false"),
    (["doctor", EXAMPLE], "hpolab: experiment digits_own_loop brings its own training loop (train(config, trial)); "
                          "hpolab doctor needs the load_data/build_model contract"),
    (["lr-find", EXAMPLE], "hpolab: experiment digits_own_loop brings its own training loop (train(config, trial)); "
                           "hpolab lr-find needs the load_data/build_model contract"),
])
def test_what_only_the_routine_can_do_is_refused_with_one_line(store, args, line):
    out = run_cli("--store", str(store), *args, cwd=ROOT, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [x for x in (out.stdout + out.stderr).splitlines() if x.strip()]
    assert line in [x.strip().removeprefix("- ") for x in lines], lines
    assert "Traceback" not in out.stderr and len(lines) <= 2  # the line (under the spec's heading)
    assert not (store / "lr-find").exists()


def test_an_experiment_without_train_or_build_model_is_told_what_to_define(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "half.py").write_text("MODEL_DEFAULTS = {}\n")
    (tmp_path / "s.yaml").write_text("name: half\nexperiment: half\n")
    out = run_cli("study", "validate", "s.yaml", cwd=tmp_path, check=False)
    assert out.returncode == 2
    assert ("experiment: half defines neither train(config, trial) (your own training loop) nor build_model and "
            "load_data (the platform's routine); define one of them (see experiments/README.md)") in out.stderr + out.stdout


@pytest.mark.parametrize("spec, wrong", [
    ("studies/digits_cnn.yaml", "metric: 'val_f1' is not a metric of task classification"),  # the built-in loop's task
    (EXAMPLE, "metric: 'val_f1' is not in the METRIC_DIRECTIONS of experiment digits_own_loop"),  # an own loop's declaration
])
def test_a_one_metric_spec_with_constraints_has_its_metric_checked_whichever_the_loop(spec, wrong):
    """The spec checks are one path over the loop's declaration: a constraint does not switch off the check
    of the study metric (it did for an own loop)."""
    from hpolab.config.spec import SpecError, load_spec

    constraint = "constraints=[{metric: params, max: 1000000000}]"
    load_spec(ROOT / spec, [constraint])  # (fine as it is)
    with pytest.raises(SpecError) as e:
        load_spec(ROOT / spec, [constraint, "metric=val_f1"])
    assert wrong in str(e.value), str(e.value)
