"""hpolab.integrations.transformers: a Hugging Face TrainerCallback over the own-loop trial.

Unit tests drive real `transformers.Trainer`s on a tiny BERT built from a config (no download) with a
recording trial (tests/recording_trial.py): the epochs and `eval_*` metrics reported, the stop honoured,
the checkpoint folder packed into the report and unpacked into a resumed train() that continues the same
curve. The studies at the end run experiments/tiny_text_hf.py through the real CLI.
"""

from __future__ import annotations

import json

import sys

import pytest

pytest.importorskip("transformers", reason="the transformers extra is not installed (pip install hpolab[transformers])")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402

from hpolab.integrations.transformers import HpolabCallback, LogitsModel, pack_folder, resume_folder, unpack_folder  # noqa: E402
from conftest import assert_sigterm_then_rerun_resumes, assert_study_check_clean, metric_steps, open_study, run_cli, trial_run  # noqa: E402
from recording_trial import RecordingTrial  # noqa: E402

VOCAB, LENGTH = 24, 9


def _dataset(n: int, seed: int) -> list[dict]:
    ids = np.random.default_rng(seed).integers(2, VOCAB, size=(n, LENGTH))
    labels = (ids < 13).sum(1) > LENGTH // 2  # more low tokens than high ones
    return [{"input_ids": torch.tensor(i), "labels": torch.tensor(int(y))} for i, y in zip(ids, labels)]


def _model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                    intermediate_size=32, max_position_embeddings=LENGTH, num_labels=2))


def _accuracy(pred) -> dict[str, float]:
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def _train(trial, epochs: int, **args) -> Trainer:
    options = dict(eval_strategy="epoch", save_strategy="epoch", logging_strategy="epoch", num_train_epochs=epochs, learning_rate=3e-3,
                   per_device_train_batch_size=32, report_to="none", use_cpu=True, seed=0, disable_tqdm=True, save_total_limit=1)
    options.update(args)
    trainer = Trainer(model=_model(), args=TrainingArguments(output_dir=str(trial.dir / "hf"), **options), train_dataset=_dataset(128, 0),
                      eval_dataset=_dataset(64, 1), compute_metrics=_accuracy, callbacks=[HpolabCallback(trial)])
    trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=resume_folder(trial))
    return trainer


class Killed(Exception):
    pass


class KilledAfter(RecordingTrial):
    """A trial whose process dies right after its report of epoch `kill_at` (checkpoint saved)."""

    def __init__(self, folder, kill_at: int):
        super().__init__(folder)
        self.kill_at = kill_at

    def report(self, epoch, metrics, checkpoint=None):
        stop = super().report(epoch, metrics, checkpoint)
        if epoch == self.kill_at:
            raise Killed
        return stop


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # (conftest: tiny models, one intra-op thread)


def test_each_evaluation_is_reported_with_its_epoch_metrics_and_checkpoint_folder(tmp_path):
    trial = RecordingTrial(tmp_path)
    trainer = _train(trial, 3)
    assert trial.epochs == [1, 2, 3]
    for _, metrics in trial.reports:
        assert {"eval_loss", "eval_accuracy", "train_loss"} <= set(metrics) and all(k == "train_loss" or k.startswith("eval_") for k in metrics)
    assert [e for e, _ in trial.saved] == [1, 2, 3]  # each with its epoch's report
    state = trial.load(trial.saved[-1][1])
    step = trainer.state.global_step
    assert state["folder"] == f"checkpoint-{step}"
    assert {"trainer_state.json", "optimizer.pt", "scheduler.pt", "model.safetensors"} <= set(state["files"])
    assert json.loads(state["files"]["trainer_state.json"])["global_step"] == step
    # the packed folders live on in the trial's checkpoint only: none is left in the trial's folder
    assert not list((tmp_path / "hf").glob("checkpoint-*"))


def test_an_evaluate_after_train_reports_nothing_more(tmp_path):
    trial = RecordingTrial(tmp_path)
    trainer = _train(trial, 2)
    trainer.evaluate()  # what many scripts do after train(): not an epoch of the trial
    assert trial.epochs == [1, 2]


def test_a_true_report_stops_training_after_that_epoch(tmp_path):
    trial = RecordingTrial(tmp_path, stop_at=2)
    trainer = _train(trial, 5)
    assert trial.epochs == [1, 2]
    assert trainer.state.epoch == 2.0


def test_a_packed_folder_unpacks_to_the_same_files(tmp_path):
    src = tmp_path / "checkpoint-8"
    (src / "sub").mkdir(parents=True)
    (src / "a.json").write_text("{}")
    (src / "sub" / "w.bin").write_bytes(bytes(range(256)))
    out = unpack_folder(RecordingTrial.load(_serialized(pack_folder(src))), tmp_path / "back")
    assert out == tmp_path / "back" / "checkpoint-8"
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == {p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file()}


def _serialized(state: dict) -> bytes:
    from hpolab.train.checkpoint import serialize_checkpoint

    return serialize_checkpoint(state)


def test_a_resumed_train_continues_the_same_curve_from_the_restored_folder(tmp_path):
    whole = RecordingTrial(tmp_path / "whole")
    _train(whole, 4)
    first = KilledAfter(tmp_path / "first", kill_at=2)
    with pytest.raises(Killed):
        _train(first, 4)
    assert resume_folder(first) is None  # a first attempt: train() starts from scratch
    again = RecordingTrial(tmp_path / "again", restored=first.saved[-1][1], start_epoch=3)
    _train(again, 4)
    assert not (tmp_path / "again" / "hf-resume").exists()  # read by train(), then deleted
    assert again.epochs == [3, 4]
    keys = ("eval_loss", "eval_accuracy", "train_loss")  # (not eval_runtime: a wall time)
    for (e1, m1), (e2, m2) in zip(whole.reports[2:], again.reports):
        assert e1 == e2 and [m1[k] for k in keys] == pytest.approx([m2[k] for k in keys], rel=1e-5)


def test_a_resume_with_a_new_learning_rate_gives_it_to_the_restored_optimizer_along_its_schedule(tmp_path):
    # PBT's explore: the checkpoint was trained at lr 3e-3, the resumed attempt's config says 6e-3
    whole = RecordingTrial(tmp_path / "whole")
    plain = _train(whole, 4)
    first = KilledAfter(tmp_path / "first", kill_at=2)
    with pytest.raises(Killed):
        _train(first, 4)
    again = RecordingTrial(tmp_path / "again", restored=first.saved[-1][1], start_epoch=3,
                           changes=({"trainer": {"lr": 3e-3}}, {"trainer": {"lr": 6e-3}}))
    resumed = _train(again, 4)
    assert len(again.applied) == 1  # the callback gave the changes to the optimizer the Trainer restored
    lrs = [{e["epoch"]: e["learning_rate"] for e in t.state.log_history if "learning_rate" in e} for t in (plain, resumed)]
    assert lrs[1][3.0] == pytest.approx(2 * lrs[0][3.0]) and lrs[1][4.0] == pytest.approx(2 * lrs[0][4.0])  # the same linear decay, twice as high


def test_evaluation_other_than_per_epoch_is_refused_with_the_setting_to_use(tmp_path):
    with pytest.raises(ValueError, match=r"eval_strategy='epoch'"):
        _train(RecordingTrial(tmp_path), 1, eval_strategy="no", save_strategy="no")


def test_logits_model_takes_ids_and_returns_the_logits():
    model = _model().eval()
    ids = torch.tensor([d["input_ids"].tolist() for d in _dataset(3, 2)])
    with torch.no_grad():
        assert torch.equal(LogitsModel(model)(ids), model(input_ids=ids).logits)


def test_import_without_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "hpolab.integrations.transformers")
    with pytest.raises(ModuleNotFoundError) as raised:
        import hpolab.integrations.transformers  # noqa: F401
    assert str(raised.value) == "hpolab.integrations.transformers needs transformers: pip install hpolab[transformers]"
    assert raised.value.__suppress_context__


# ---------------------------------------------------------------- the real CLI on experiments/tiny_text_hf.py

SPEC, STUDY = "studies/tiny_text_hf.yaml", "tiny-text-hf"


@pytest.mark.slow
def test_a_hugging_face_study_prunes_and_logs_its_runs_as_the_routines(store, tmp_path):
    import mlflow.pyfunc
    from optuna.trial import TrialState

    from hpolab.train.checkpoint import load_checkpoint

    # a grid of two LRs on 1,024 sequences: 3e-3 is above 0.9 after epoch 1, 1e-6 still at chance (0.5), pruned there
    out = run_cli("--store", str(store), "study", "run", SPEC, "n_trials=2", "trainer.max_epochs=2", "data.n_train=1024", "sampler={type: grid}",
                  "search_space={trainer.lr: {type: categorical, choices: [1.0e-6, 3.0e-3]}}", "pruner={type: threshold, kwargs: {lower: 0.75}}")
    client, study = open_study(store, STUDY)
    by_lr = {t.params["trainer.lr"]: t for t in study.get_trials()}
    done, pruned = by_lr[3.0e-3], by_lr[1.0e-6]
    assert done.state == TrialState.COMPLETE and pruned.state == TrialState.PRUNED, out.stdout
    for trial, epochs in ((done, [1, 2]), (pruned, [1])):
        run = trial_run(trial, client)
        assert run.data.tags["hpolab.state"] == trial.state.name
        for metric in ("eval_accuracy", "eval_loss", "train_loss"):  # at step = epoch
            assert metric_steps(client, run.info.run_id, metric) == epochs
    run_id = trial_run(done, client).info.run_id
    best = [a.path for a in client.list_artifacts(run_id, "checkpoints")]
    assert best == ["checkpoints/best.pt"]  # the best epoch's trial.checkpoint: the Trainer's folder inside
    saved = load_checkpoint(client.download_artifacts(run_id, best[0], str(tmp_path)))
    assert {"trainer_state.json", "optimizer.pt", "model.safetensors"} <= set(saved["state"]["files"])
    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model(trial_run(done, client).data.tags["hpolab.model_uri"])  # LogitsModel(model)
    ids = np.ones((3, 16), dtype=np.int64)
    assert np.asarray(model.predict(ids)).shape == (3, 2)
    assert "hpolab.model_uri" not in trial_run(pruned, client).data.tags
    assert_study_check_clean(store, STUDY)
    out = run_cli("--store", str(store), "promote", "--no-race", STUDY)  # the experiment's evaluate(model, "test") gates it
    assert client.get_model_version_by_alias(STUDY, "champion").run_id == trial_run(done, client).info.run_id, out.stdout


@pytest.mark.slow
def test_an_interrupted_hugging_face_trial_resumes_from_its_checkpoint_on_one_epoch_axis(store):
    args = ["n_trials=2", "parallel=2", "trainer.max_epochs=8", "log_models=none"]
    assert_sigterm_then_rerun_resumes(store, SPEC, STUDY, args, "eval_accuracy", 8)