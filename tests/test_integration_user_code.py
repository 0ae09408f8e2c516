"""A LightningModule and a Hugging Face Trainer script as users write them, run as the how-to says.

tests/own_loop_project/experiments/lightning_user.py: a classifier in the style of Lightning's examples
(`train_loss` logged on step and epoch, a default Trainer with progress bar, model summary and logger);
hf_user.py: a tiny BERT from a config, `output_dir="results"`, the Trainer's progress bars, a model saved
to a relative path. Through the real CLI, from a working directory that is not the project's.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import open_study, run_cli, trial_run

pytest.importorskip("lightning", reason="the lightning extra is not installed")
pytest.importorskip("transformers", reason="the transformers extra is not installed")

PROJECT = Path(__file__).parent / "own_loop_project"
HPOLAB_LINE = ("study ", "  optuna:", "  mlflow:", "trial ", "trials ", "        ", "elapsed ", "┏", "┃", "┡", "│", "└", "epochs used")


def _unattributed(stdout: str) -> list[str]:
    """Console lines that are neither hpolab's own (`00:08 trial 0 started`, the table) nor a trial's `trial N | ...`."""
    return [line for line in stdout.splitlines() if line.strip() and not line.startswith(HPOLAB_LINE)
            and not re.match(r"\d\d:\d\d ", line) and "study" not in line]


def test_a_lightning_module_logs_one_train_loss_per_epoch_its_version_and_its_files_in_its_trial(store, tmp_path):
    out = run_cli("--store", str(store), "study", "run", str(PROJECT / "studies/lightning_user.yaml"), cwd=tmp_path)
    client, study = open_study(store, "lightning-user")
    assert all(t.state == TrialState.COMPLETE for t in study.get_trials()), out.stdout
    for t in study.get_trials():
        run = trial_run(t, client)
        logged = {k for k in run.data.metrics if not k.startswith("system/")}  # (system/: its processes, sampled by the driver)
        assert logged == {"train_loss", "val_loss", "val_acc", "opt_lr"}  # no train_loss_step / _epoch
        assert run.data.tags["env.lightning"] == metadata.version("lightning")
        assert (store / "trials" / "lightning-user" / f"trial-{t.number}" / "lightning_logs").is_dir()
    assert not (tmp_path / "lightning_logs").exists()  # the default logger wrote into each trial's folder
    assert not _unattributed(out.stdout), _unattributed(out.stdout)  # banners and progress bars say their trial
    assert any(line.startswith("trial 0 | ") for line in out.stdout.splitlines())


@pytest.mark.slow
def test_a_trainer_script_with_relative_paths_logs_the_weights_it_ends_with(store, tmp_path):
    out = run_cli("--store", str(store), "study", "run", str(PROJECT / "studies/hf_user.yaml"), "sampler={type: grid}",
                  "search_space={model.load_best: {type: categorical, choices: [false, true]}}", cwd=tmp_path)
    client, study = open_study(store, "hf-user")
    assert not (tmp_path / "results").exists() and not _unattributed(out.stdout), _unattributed(out.stdout)
    for t in study.get_trials():
        assert t.state == TrialState.COMPLETE, out.stdout
        run = trial_run(t, client)
        assert (store / "trials" / "hf-user" / f"trial-{t.number}" / "results" / "final").is_dir()
        assert run.data.tags["env.transformers"] == metadata.version("transformers")
        assert run.data.tags["env.accelerate"] == metadata.version("accelerate")
        history = {m: {p.step: p.value for p in client.get_metric_history(run.info.run_id, m)} for m in ("eval_loss", "eval_accuracy")}
        # load_best_model_at_end: the Trainer ends on its best checkpoint (by eval_loss); else on its last epoch
        epoch = min(history["eval_loss"], key=history["eval_loss"].get) if t.params["model.load_best"] else 3
        assert run.data.tags["hpolab.model_epoch"] == run.data.tags["hpolab.best_epoch"] == str(epoch), (t.params, history)
        assert t.value == pytest.approx(history["eval_accuracy"][epoch])
        linked = {m.key: (m.step, m.value) for m in client.get_logged_model(run.data.tags["hpolab.model_id"]).metrics}
        assert linked["eval_accuracy"] == (epoch, pytest.approx(history["eval_accuracy"][epoch]))

    # (--no-race: the gate's table is the point here; a race from this folder cannot import the experiment)
    promote = run_cli("--store", str(store), "promote", "hf-user", "--no-race", cwd=tmp_path)  # evaluate() returns the study metric's name
    header = next(line for line in promote.stdout.splitlines() if line.strip().startswith("eval_accuracy"))
    assert header.split() == ["eval_accuracy", "test", "eval_loss", "test", "eval_accuracy"], promote.stdout  # no name twice
