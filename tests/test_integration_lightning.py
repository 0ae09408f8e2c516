"""hpolab.integrations.lightning: a Lightning Callback over the own-loop trial.

Unit tests drive real `lightning.Trainer`s on a tiny model with a recording trial (tests/recording_trial.py):
the epochs and metrics reported, the stop honoured, Lightning's checkpoint surviving the platform's
weights-only save and load into a resumed fit that continues the same curve. The studies at the end run
experiments/digits_lightning.py through the real CLI.
"""

from __future__ import annotations

import sys
import warnings

import pytest

pytest.importorskip("lightning", reason="the lightning extra is not installed (pip install hpolab[lightning])")

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from hpolab.integrations.lightning import HpolabCallback, resume_path  # noqa: E402
from conftest import assert_sigterm_then_rerun_resumes, assert_study_check_clean, metric_steps, open_study, run_cli, trial_run  # noqa: E402
from recording_trial import RecordingTrial  # noqa: E402


class Tiny(L.LightningModule):
    def __init__(self, width: int = 4):
        super().__init__()
        self.save_hyperparameters()  # (the checkpoint then carries them too: still plain data)
        self.net = nn.Linear(width, 2)

    def training_step(self, batch, _):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9)  # momentum: optimizer state to resume
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)}


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] + 0.3 * x[:, 1] > 0).long()), batch_size=16)  # no shuffle: a resume replays exactly


def _fit(trial: RecordingTrial, max_epochs: int, **trainer_kwargs) -> Tiny:
    torch.manual_seed(0)
    module = Tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on DataLoader workers, srun, ...
        trainer = L.Trainer(max_epochs=max_epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False, callbacks=[HpolabCallback(trial)], **trainer_kwargs)
        trainer.fit(module, _loader(), _loader(), ckpt_path=resume_path(trial))
    return module


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # (conftest: tiny models, one intra-op thread)


def test_each_validated_epoch_is_reported_once_with_its_metrics_and_checkpoint(tmp_path):
    trial = RecordingTrial(tmp_path)
    _fit(trial, 3)  # the sanity check's validation (2 batches by default) is not an epoch
    assert trial.epochs == [1, 2, 3]
    for _, metrics in trial.reports:
        assert set(metrics) == {"train_loss", "val_loss", "val_acc"}
    # the training loss is each epoch's own (at the end of validation it would still be the previous one's)
    assert len({m["train_loss"] for _, m in trial.reports}) == 3
    assert [e for e, _ in trial.saved] == [1, 2, 3]
    state = trial.load(trial.saved[-1][1])  # Lightning's full checkpoint, loadable as data only
    assert {"state_dict", "optimizer_states", "lr_schedulers", "loops", "epoch", "global_step"} <= set(state)
    assert state["epoch"] == 2 and state["global_step"] == 12


def test_a_true_report_stops_the_fit_after_that_epoch(tmp_path):
    trial = RecordingTrial(tmp_path, stop_at=2)
    _fit(trial, 5)
    assert trial.epochs == [1, 2]


def test_only_epochs_that_validated_are_reported(tmp_path):
    trial = RecordingTrial(tmp_path)
    _fit(trial, 4, check_val_every_n_epoch=2)
    assert trial.epochs == [2, 4]


def test_a_resumed_fit_continues_the_same_curve_from_the_restored_checkpoint(tmp_path):
    whole = RecordingTrial(tmp_path / "whole")
    _fit(whole, 4)
    first = RecordingTrial(tmp_path / "first")
    _fit(first, 2)  # an attempt that ended after epoch 2 (as an interrupted one would)
    assert resume_path(first) is None  # nothing restored: fit starts at epoch 1
    again = RecordingTrial(tmp_path / "again", restored=first.saved[-1][1], start_epoch=3)
    module = _fit(again, 4)
    assert not (tmp_path / "again" / "lightning-resume.ckpt").exists()  # read by fit, then deleted
    assert again.epochs == [3, 4]
    for (e1, m1), (e2, m2) in zip(whole.reports[2:], again.reports):
        assert e1 == e2 and m1 == pytest.approx(m2, rel=1e-6)  # weights, momentum and LR schedule all restored
    final = whole.load(whole.saved[-1][1])["state_dict"]
    assert all(torch.allclose(final[k], v) for k, v in module.state_dict().items())


def test_import_without_lightning_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.delitem(sys.modules, "hpolab.integrations.lightning")
    with pytest.raises(ModuleNotFoundError) as raised:
        import hpolab.integrations.lightning  # noqa: F401
    assert str(raised.value) == "hpolab.integrations.lightning needs Lightning: pip install hpolab[lightning]"
    assert raised.value.__suppress_context__  # one message, not a second traceback of the import machinery


# ---------------------------------------------------------------- the real CLI on experiments/digits_lightning.py

SPEC, STUDY = "studies/digits_lightning.yaml", "digits-lightning"


@pytest.mark.slow
def test_a_lightning_study_prunes_and_logs_its_runs_as_the_routines(store, tmp_path):
    import mlflow.pyfunc
    import numpy as np
    from optuna.trial import TrialState

    # a grid of two LRs: 1e-5 is still near chance (0.1) after epoch 1, below the threshold, so pruned there
    out = run_cli("--store", str(store), "study", "run", SPEC, "n_trials=2", "trainer.max_epochs=3", "sampler={type: grid}",
                  "search_space={trainer.lr: {type: categorical, choices: [1.0e-5, 1.0e-2]}}", "pruner={type: threshold, kwargs: {lower: 0.5}}")
    client, study = open_study(store, STUDY)
    by_lr = {t.params["trainer.lr"]: t for t in study.get_trials()}
    done, pruned = by_lr[1.0e-2], by_lr[1.0e-5]
    assert done.state == TrialState.COMPLETE and pruned.state == TrialState.PRUNED, out.stdout
    for trial, epochs in ((done, [1, 2, 3]), (pruned, [1])):
        run = trial_run(trial, client)
        assert run.data.tags["hpolab.state"] == trial.state.name
        for metric in ("val_acc", "val_loss", "train_loss"):  # what the module logged, at step = epoch
            assert metric_steps(client, run.info.run_id, metric) == epochs
    tags = trial_run(done, client).data.tags
    best = [a.path for a in client.list_artifacts(trial_run(done, client).info.run_id, "checkpoints")]
    assert best == ["checkpoints/best.pt"]  # the best epoch's trial.checkpoint: Lightning's checkpoint inside
    from hpolab.train.checkpoint import load_checkpoint

    saved = load_checkpoint(client.download_artifacts(trial_run(done, client).info.run_id, best[0], str(tmp_path)))
    assert saved["epoch"] - 1 == saved["state"]["epoch"] and {"state_dict", "optimizer_states", "loops"} <= set(saved["state"])
    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model(tags["hpolab.model_uri"])  # the network train() gave trial.log_model
    assert np.asarray(model.predict(np.zeros((3, 64), dtype=np.float32))).shape == (3, 10)
    assert "hpolab.model_uri" not in trial_run(pruned, client).data.tags
    assert_study_check_clean(store, STUDY)
    out = run_cli("--store", str(store), "promote", "--no-race", STUDY)  # the experiment's evaluate(model, "test") gates it
    assert client.get_model_version_by_alias(STUDY, "champion").run_id == trial_run(done, client).info.run_id, out.stdout


@pytest.mark.slow
def test_an_interrupted_lightning_trial_resumes_from_its_checkpoint_on_one_epoch_axis(store):
    args = ["n_trials=2", "parallel=2", "trainer.max_epochs=12", "log_models=none"]
    assert_sigterm_then_rerun_resumes(store, SPEC, STUDY, args, "val_acc", 12)