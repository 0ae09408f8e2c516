"""A user's existing PyTorch code under hpolab, as the own-loop how-to tells them to bring it.

tests/own_loop_project/experiments/classic_mnist.py is PyTorch's classic MNIST example (its Net, its
epoch function, Adadelta, StepLR, its prints) with `train(config, trial)` added, on tiny synthetic
images; its model: keys are the knobs each test turns. Every study runs through the real CLI.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import open_study, run_cli, trial_run

PROJECT = Path(__file__).parent / "own_loop_project"
SPEC, STUDY = "studies/classic_mnist.yaml", "classic-mnist"


def _run(store: Path, *args: str, check: bool = True, cwd: Path = PROJECT):
    return run_cli("--store", str(store), "study", "run", str(PROJECT / SPEC), *args, cwd=cwd, check=check)


def _steps(client, run_id: str, metric: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, metric))


def _one_line(text: str) -> str:
    return " ".join(text.split())  # (the console wraps long lines)


def test_a_loop_counting_epochs_from_0_or_not_at_all_is_recorded_from_1(store):
    out = _run(store, "sampler={type: grid}", "search_space={model.epochs_from: {type: categorical, choices: [0, none]}}")
    client, study = open_study(store, STUDY)
    trials = study.get_trials()
    assert len(trials) == 2 and all(t.state == TrialState.COMPLETE for t in trials), out.stdout
    for t in trials:
        assert sorted(t.intermediate_values) == [1, 2]
        assert _steps(client, t.user_attrs["mlflow_run_id"], "val_acc") == [1, 2]


def test_a_contract_error_fails_its_trial_with_one_line_and_stops_the_study_at_once(store):
    out = _run(store, "n_trials=4", "parallel=1", "model.bad_report=epoch", check=False)
    client, study = open_study(store, STUDY)
    (t,) = study.get_trials()  # the first trial's line, then no more trials
    assert t.state == TrialState.FAIL and out.returncode == 1, out.stdout
    reason = trial_run(t, client).data.tags["hpolab.fail_reason"]
    assert reason.startswith("trial.report: epoch must be a whole number (the loop's epoch counter), got '1'")
    assert "Traceback" not in out.stdout + out.stderr
    assert "stopped: trial 0 broke the own-loop contract: trial.report: epoch must be a whole number" in _one_line(out.stdout + out.stderr)


def test_a_train_function_with_another_signature_is_refused_when_the_spec_loads(tmp_path, store):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "mnist.py").write_text(
        "def train(args, model, device, train_loader, optimizer, epoch):\n    pass\n")  # the example's own train()
    (tmp_path / "s.yaml").write_text("name: mnist\nexperiment: mnist\n")
    line = ("experiment: mnist defines train(args, model, device, train_loader, optimizer, epoch); an own-loop experiment "
            "defines train(config, trial) (rename the existing function, e.g. to train_epoch)")
    for command in (["study", "validate", "s.yaml"], ["--store", str(store), "study", "run", "s.yaml"]):
        out = run_cli(*command, cwd=tmp_path, check=False)
        assert out.returncode == 2 and line in _one_line(out.stdout + out.stderr), out.stdout + out.stderr
        assert "Traceback" not in out.stderr
    _, = [p for p in store.iterdir() if p.name == "optuna.db"]  # (the store as it was: nothing started)


def test_own_loop_params_are_the_specs_keys_the_sampled_values_and_what_the_loop_logs(store):
    _run(store, "n_trials=1", "model.log_params=true")
    client, study = open_study(store, STUDY)
    (t,) = study.get_trials()
    params = trial_run(t, client).data.params
    assert {"trainer.max_epochs", "trainer.batch_size", "trainer.lr", "trainer.device", "seed", "metric"} <= set(params)
    assert params["trainer.lr"] == str(t.params["trainer.lr"])
    assert params["optimizer"] == "adadelta" and params["scheduler"] == "step(gamma=0.7)"  # trial.log_params
    claimed = {"trainer.optimizer", "trainer.scheduler", "trainer.weight_decay", "trainer.momentum", "trainer.amp"}
    assert not claimed & set(params), sorted(claimed & set(params))  # the routine's defaults: the loop never used them


@pytest.mark.parametrize("shown", [True, False])
def test_each_trials_output_is_kept_on_its_run_and_shown_with_its_number(store, tmp_path, shown):
    out = _run(store, *([] if shown else ["--hide-trial-output"]))  # two trials printing at once
    client, study = open_study(store, STUDY)
    lines = out.stdout.splitlines()
    assert not [line for line in lines if line.startswith(("Train Epoch", "Test set"))]  # nothing without its trial
    for t in study.get_trials():
        mine = [line for line in lines if line.startswith(f"trial {t.number} | ")]
        assert sum("Test set: Average loss" in line for line in mine) == (2 if shown else 0), out.stdout
        log = Path(client.download_artifacts(t.user_attrs["mlflow_run_id"], "output.log", str(tmp_path / str(t.number)))).read_text()
        assert log.count("Test set: Average loss") == 2 and log.count("Train Epoch: 1 [0/256]") == 1  # its own, whole


def test_a_failed_trials_last_output_is_in_its_failure_line_its_run_and_study_status(store):
    out = _run(store, "n_trials=1", "model.fail_at=1", check=False)
    client, study = open_study(store, STUDY)
    (t,) = study.get_trials()
    assert t.state == TrialState.FAIL
    assert "trial 0 FAIL -- RuntimeError: the loop failed on purpose" in out.stdout
    after = out.stdout.split("trial 0 FAIL", 1)[1].splitlines()
    assert after[1].strip() == "its last output:" and after[2].strip().startswith("| ")
    assert "| about to fail after epoch 1" in [line.strip() for line in after[:8]], out.stdout
    assert trial_run(t, client).data.tags["hpolab.output_tail"].endswith("about to fail after epoch 1")
    status = run_cli("--store", str(store), "study", "status", STUDY, cwd=PROJECT)
    assert "trial 0 failed: RuntimeError: the loop failed on purpose" in status.stdout
    assert "  | about to fail after epoch 1" in status.stdout.splitlines()


def test_each_trial_runs_in_its_own_folder(store, tmp_path):
    _run(store, "model.write=loss.txt", cwd=tmp_path)  # train() appends to a relative path each epoch
    assert not (tmp_path / "loss.txt").exists()
    for n in (0, 1):
        written = (store / "trials" / STUDY / f"trial-{n}" / "loss.txt").read_text().splitlines()
        assert [line.split()[:2] for line in written] == [[str(n), "1"], [str(n), "2"]]  # its own two epochs, nobody else's


def test_the_elapsed_time_of_a_rerun_is_the_commands_whole_time(store):
    import re
    import time

    _run(store, "n_trials=1")
    started = time.monotonic()
    out = _run(store, "n_trials=2")  # a re-run: set-up, one more trial
    wall = time.monotonic() - started
    printed = float(re.search(r"elapsed ([\d.]+) s", out.stdout).group(1))
    assert wall - 1.0 <= printed <= wall + 0.5, (printed, wall)
