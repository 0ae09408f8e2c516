"""Study controls: a study remembers its spec (refused changes, --allow-spec-change, --new-study),
`enqueue:`, `stop_after_no_improvement:`, and the progress line / table saying best vs last.

Logic first, on fabricated Optuna studies (no training); then the real CLI on tiny digits studies.
"""

from __future__ import annotations

import io

import optuna
import pytest
from mlflow import MlflowClient
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console

from conftest import run_cli
from hpolab.config.spec import load_spec
from hpolab.errors import UserError
from hpolab.study.driver.progress import Progress, best_and_last
from hpolab.study.driver.spec_guard import check_spec, defining_spec, spec_hash
from hpolab.study.objectives.stopping import no_improvement_streak

SPEC = "studies/digits_cnn.yaml"


# ---------------------------------------------------------------- logic on fabricated trials


def _study_with_trial(spec, lr: float, channels: int) -> optuna.Study:
    """An in-memory study that recorded `spec` and has one COMPLETE trial with these params."""
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("hpolab.spec", defining_spec(spec))
    study.add_trial(create_trial(
        params={"trainer.lr": lr, "model.channels": channels}, value=0.9,
        distributions={"trainer.lr": FloatDistribution(3e-4, 3e-2, log=True),
                       "model.channels": CategoricalDistribution([8, 16, 32])}))
    return study


@pytest.fixture(scope="module")
def base():
    return load_spec(SPEC, ["search_space={trainer.lr: {type: float, low: 3.0e-4, high: 3.0e-2, log: true}, "
                            "model.channels: {type: categorical, choices: [8, 16, 32]}}"])


def _edit(*overrides):
    return load_spec(SPEC, [f"search_space={{trainer.lr: {{type: float, low: 3.0e-4, high: 3.0e-2, log: true}}, "
                            f"model.channels: {{type: categorical, choices: [8, 16, 32]}}}}", *overrides])


def test_the_same_spec_and_run_controls_are_no_change(base):
    study = _study_with_trial(base, 0.02, 16)
    assert check_spec(study, base, allow_change=False) is None
    controls = _edit("n_trials=99", "timeout=60", "parallel=3", "max_retries=2", "trial_timeout=10",
                     "stop_after_no_improvement=4", "enqueue=[{trainer.lr: 0.001}]")
    assert check_spec(study, controls, allow_change=False) is None
    # where a trial runs is not what it means: moving the study to a bigger box needs no flag
    placement = _edit("trainer.devices=2", "trainer.num_workers=2", "trainer.device=cpu", "trainer.compile=true",
                      "log_models={top_k: 3}", "keep_checkpoints={top_k: 3}", "checkpoint_upload_every=5")
    assert check_spec(study, placement, allow_change=False) is None


def test_a_field_added_to_hpolab_since_the_study_was_recorded_is_no_change(base):
    study = _study_with_trial(base, 0.02, 16)
    recorded = defining_spec(base)
    del recorded["trainer"]["early_stopping_min_delta"]  # as if recorded by an hpolab that had no such key yet (default 0.0)
    study.set_user_attr("hpolab.spec", recorded)
    assert check_spec(study, base, allow_change=False) is None
    with pytest.raises(UserError, match=r"trainer.early_stopping_min_delta: \(absent\) -> 0.01"):
        check_spec(study, _edit("trainer.early_stopping_min_delta=0.01"), allow_change=False)


def test_a_new_study_records_version_0(base):
    change = check_spec(optuna.create_study(), base, allow_change=False)
    assert change.version == 0 and change.defining == defining_spec(base) and change.diff == []


def test_a_changed_search_space_is_refused_with_a_diff_and_the_options(base):
    study = _study_with_trial(base, 0.02, 16)
    with pytest.raises(UserError) as e:
        check_spec(study, _edit("search_space.trainer.lr.high=0.1", "trainer.max_epochs=3"), allow_change=False)
    text = str(e.value)
    assert "search_space.trainer.lr.high: 0.03 -> 0.1" in text
    assert "trainer.max_epochs: 12 -> 3" in text
    assert "--new-study NAME" in text and "--allow-spec-change" in text
    assert spec_hash(defining_spec(base)) in text


def test_allow_spec_change_accepts_a_widened_range_and_refuses_what_sampled_values_do_not_fit(base):
    study = _study_with_trial(base, 0.02, 16)
    change = check_spec(study, _edit("search_space.trainer.lr.high=0.1"), allow_change=True)
    assert change.version == 1 and change.diff == [("search_space.trainer.lr.high", 0.03, 0.1)]
    # narrowed below the sampled 0.02: the trial is named
    with pytest.raises(UserError, match=r"trial 0: trainer.lr=0.02 is outside the new float \[0.0003, 0.01, log\]"):
        check_spec(study, _edit("search_space.trainer.lr.high=0.01"), allow_change=True)
    # Optuna cannot change categorical choices within a study, even by adding one
    with pytest.raises(UserError, match=r"model.channels: an Optuna study cannot change .* \(choices \[8, 16, 32\] -> choices \[8, 16, 32, 64\]"):
        check_spec(study, _edit("search_space.model.channels.choices=[8, 16, 32, 64]"), allow_change=True)
    # a param the study sampled is no longer searched
    with pytest.raises(UserError, match="trial 0: model.channels=16, but the new spec does not search model.channels"):
        check_spec(study, load_spec(SPEC, ["search_space={trainer.lr: {type: float, low: 3.0e-4, high: 3.0e-2, log: true}}"]),
                   allow_change=True)


def test_metric_direction_and_experiment_never_change_in_place(base):
    study = _study_with_trial(base, 0.02, 16)
    with pytest.raises(UserError) as e:
        check_spec(study, _edit("metric=val_loss", "direction=minimize"), allow_change=True)
    assert 'direction: "maximize" -> "minimize"' in str(e.value)
    assert "cannot change within a study, even with --allow-spec-change" in str(e.value)


@pytest.mark.parametrize("values, maximize, min_delta, start, expected", [
    ([0.5, 0.6, 0.7], True, 0.0, 0, 0),            # every trial improved
    ([0.5, 0.6, 0.6, None, 0.55], True, 0.0, 0, 3),  # equal, pruned, worse: 3 in a row
    ([0.5, 0.505, 0.509], True, 0.01, 0, 2),      # improvements smaller than min_delta do not count
    ([0.5, 0.505, 0.52], True, 0.01, 0, 0),       # 0.52 beats the best (0.505) by more than 0.01
    ([1.0, 0.9, 0.95], False, 0.0, 0, 1),         # minimize
    ([None, None], True, 0.0, 0, 2),              # pruned trials never improve
    ([0.5, 0.4, 0.4, 0.3], True, 0.0, 3, 1),      # re-armed after 3 results: only the 4th counts
])
def test_no_improvement_streak(values, maximize, min_delta, start, expected):
    assert no_improvement_streak(values, maximize, min_delta, start)[0] == expected


def test_best_and_last_of_a_trial():
    assert best_and_last("PRUNED", None, {1: 0.85, 2: 0.8997, 3: 0.883}, True) == (0.8997, 0.883)
    assert best_and_last("PRUNED", None, {1: 0.5, 2: 0.4}, False) == (0.4, 0.4)
    assert best_and_last("COMPLETE", 0.95, {1: 0.9, 2: 0.95, 3: 0.94}, True) == (0.95, 0.94)
    assert best_and_last("FAIL", None, {}, True) == (None, None)


def test_the_progress_line_says_best_and_last(base):
    out = io.StringIO()
    p = Progress(base, console=Console(file=out, width=200, highlight=False))
    counts = {"finished": 1, "complete": 0, "pruned": 1, "fail": 0}
    p.trial_finished(11, "PRUNED", 0.883, None, counts, {1: 0.85, 2: 0.8997, 3: 0.883})
    assert "trial 11 PRUNED val_acc best=0.8997 (last 0.883)" in out.getvalue()


# ---------------------------------------------------------------- spec errors through the real CLI


def test_enqueue_entries_are_checked_against_the_search_space(tmp_path):
    out = run_cli("study", "validate", SPEC, "enqueue=[{trainer.lr: 5.0, model.channels: 12}, {trainer.lrr: 0.1}, {}]",
                  check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "enqueue[0].trainer.lr: 5.0 is outside [0.0003, 0.03]" in out.stderr
    assert "enqueue[0].model.channels: 12 is not one of the choices [8, 16, 32]" in out.stderr
    assert "enqueue[1].trainer.lrr: not in search_space" in out.stderr
    assert "enqueue[2]: give a mapping" in out.stderr
    ok = run_cli("study", "validate", SPEC, "enqueue=[{trainer.lr: 0.001, model.dropout: 0}]", "stop_after_no_improvement=3")
    assert "stop_after_no_improvement:\n  trials: 3\n  min_delta: 0.0" in ok.stdout


# ---------------------------------------------------------------- the real CLI on tiny studies

TINY = [SPEC, "name=ctl", "parallel=1", "trainer.max_epochs=1", "pruner={type: none}", "sampler.kwargs={n_startup_trials: 1}", "log_models=none"]


def _open(store, name):
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{store / 'optuna.db'}")
    return client, study


def _snapshot(store, name):
    client, study = _open(store, name)
    parent = study.user_attrs["mlflow_parent_run_id"]
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id])
    return (len(study.trials), dict(study.user_attrs), sorted(a.path for a in client.list_artifacts(parent)),
            client.get_run(parent).data.tags, len(runs))


@pytest.mark.slow
def test_spec_changes_enqueue_and_new_study_through_the_cli(store):
    s = ["--store", str(store), "study", "run"]
    out = run_cli(*s, *TINY, "n_trials=2", "enqueue=[{trainer.lr: 0.001, model.channels: 8}]")
    client, study = _open(store, "ctl")
    first = study.trials[0]
    assert first.params["trainer.lr"] == 0.001 and first.params["model.channels"] == 8  # the enqueued entry ran first
    assert study.user_attrs["hpolab.spec_version"] == 0
    parent = study.user_attrs["mlflow_parent_run_id"]
    assert client.get_run(parent).data.tags["hpolab.spec_hash"] == study.user_attrs["hpolab.spec_hash"]
    assert "spec.yaml" in [a.path for a in client.list_artifacts(parent)]
    # the line and the table say best and last
    assert "val_acc best=" in out.stdout and "(last " in out.stdout
    assert "best val_acc" in out.stdout and "last val_acc" in out.stdout

    # a changed search space is refused: exit 2, the diff, the options, nothing written
    before = _snapshot(store, "ctl")
    out = run_cli(*s, *TINY, "n_trials=3", "search_space.trainer.lr.high=0.1", check=False)
    assert out.returncode == 2, out.stderr
    assert "search_space.trainer.lr.high: 0.03 -> 0.1" in out.stderr
    assert "--new-study NAME" in out.stderr and "--allow-spec-change" in out.stderr and "Traceback" not in out.stderr
    assert _snapshot(store, "ctl") == before

    # --allow-spec-change: a widened range keeps every sampled value valid -> accepted and recorded
    run_cli(*s, *TINY, "n_trials=3", "search_space.trainer.lr.high=0.1", "--allow-spec-change")
    client, study = _open(store, "ctl")
    assert len(study.trials) == 3 and study.user_attrs["hpolab.spec_version"] == 1
    assert study.user_attrs["hpolab.spec"]["search_space"]["trainer.lr"]["high"] == 0.1
    assert study.user_attrs["hpolab.spec_hash"] != before[1]["hpolab.spec_hash"]
    assert {"spec.yaml", "spec-1.yaml"} <= {a.path for a in client.list_artifacts(parent)}
    assert client.get_run(parent).data.tags["hpolab.spec_hash"] == study.user_attrs["hpolab.spec_hash"]
    text = (client.download_artifacts(parent, "spec-1.yaml", str(store / "dl")))
    assert "# changed search_space.trainer.lr.high: 0.03 -> 0.1" in open(text).read()

    # --new-study: the edited spec (a different metric) as a study of its own; the old one untouched
    run_cli(*s, *TINY, "n_trials=1", "metric=val_loss", "direction=minimize", "--new-study", "ctl-loss")
    _, new = _open(store, "ctl-loss")
    assert len(new.trials) == 1 and new.direction == optuna.study.StudyDirection.MINIMIZE
    assert len(_open(store, "ctl")[1].trials) == 3


@pytest.mark.slow
def test_stop_after_no_improvement_stops_early_and_stays_stopped(store):
    # min_delta 1.0 on val_acc: after the first COMPLETE trial nothing can improve by more than that.
    s = ["--store", str(store), "study", "run", *TINY, "stop_after_no_improvement={trials: 2, min_delta: 1.0}"]
    out = run_cli(*s, "n_trials=6")
    assert "stop_after_no_improvement: 2 finished trials in a row brought no improvement larger than 1" in out.stdout
    client, study = _open(store, "ctl")
    assert len(study.trials) == 3 and all(t.state == TrialState.COMPLETE for t in study.trials)
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert "no improvement" in parent.data.tags["hpolab.stop_reason"]
    assert parent.info.status == "FINISHED"

    again = run_cli(*s, "n_trials=6")  # stopped: says why, runs nothing, exit 0
    assert "stopped earlier" in again.stdout and "Raise n_trials above 6" in again.stdout
    assert len(_open(store, "ctl")[1].trials) == 3

    run_cli(*s, "n_trials=8")  # a larger budget re-arms it: counting starts after the stop
    _, study = _open(store, "ctl")
    assert len(study.trials) == 5
    assert study.user_attrs["hpolab.stop"]["n_trials"] == 8
