"""fit(): accumulation, resume, determinism, failure modes, imbalance, a real-data sanity run (why it
stops: test_train_stopping.py).

Tiny models on tiny synthetic tensors (CPU, a few seconds for the file).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from hpolab.train import (
    DataSplits,
    FitResult,
    NonFiniteLossError,
    TrainConfig,
    evaluate,
    fit,
    load_checkpoint,
    seed_everything,
)
from hpolab.train.batches import TensorBatches
from hpolab.train.loop import epoch_metric_names
from hpolab.train.seeding import make_generator

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # (conftest: tiny models, one intra-op thread)


LEARNING_KEYS = ("train_loss", "val_loss", "val_acc", "lr", "grad_norm", "grad_norm_max")  # not the timings


def blobs(n: int, *, classes: int = 4, dim: int = 8, seed: int = 0, weights: list[float] | None = None) -> TensorDataset:
    """Gaussian blobs: class c is shifted along axis c. `weights`: class proportions (imbalance)."""
    g = torch.Generator().manual_seed(seed)
    if weights is None:
        y = torch.randint(0, classes, (n,), generator=g)
    else:
        y = torch.multinomial(torch.tensor(weights, dtype=torch.float), n, replacement=True, generator=g)
    x = torch.randn(n, dim, generator=g) + 2.0 * F.one_hot(y, dim).float()
    return TensorDataset(x, y)


def splits(n_train: int = 96, n_val: int = 48, *, weights=None) -> DataSplits:
    return DataSplits(
        train=blobs(n_train, seed=1, weights=weights),
        val=blobs(n_val, seed=2, weights=weights),
        test=blobs(n_val, seed=3, weights=weights),
        num_classes=4,
        input_shape=(8,),
    )


class MapDataset(Dataset):
    """The same tensors, but not a TensorDataset: forces the DataLoader path."""

    def __init__(self, ds: TensorDataset):
        self.x, self.y = ds.tensors

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def mlp(seed: int = 0, dropout: float = 0.0, batchnorm: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    layers = [nn.Linear(8, 16)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(16))
    layers += [nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 4)]
    return nn.Sequential(*layers)


def cfg(**kw) -> TrainConfig:
    base = dict(max_epochs=2, batch_size=16, lr=0.05, optimizer="sgd", momentum=0.0, weight_decay=0.0, scheduler="none", device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def learning(history: list[dict]) -> list[tuple]:
    return [tuple(h[k] for k in LEARNING_KEYS) for h in history]


# ---------------------------------------------------------------- result shape and arguments


def test_result_and_metric_keys():
    data = splits()
    result = fit(cfg(), mlp(), data)
    assert isinstance(result, FitResult)
    assert result.epochs_run == 2 and result.stop_reason == "max_epochs"
    assert [h["epoch"] for h in result.history] == [1, 2]
    assert set(result.last_metrics) == set(epoch_metric_names(cfg(), 4))
    assert "val_macro_f1" not in result.last_metrics  # imbalance options off
    assert result.amp == "off" and result.device == "cpu"
    m = result.last_metrics
    assert 0 <= m["val_acc"] <= 1 and 0 <= m["data_wait_fraction"] <= 1
    assert m["samples_per_second"] > 0 and m["epoch_seconds"] > 0 and m["grad_norm_max"] >= m["grad_norm"] > 0
    assert result.best_value == max(h["val_acc"] for h in result.history)


def test_unknown_metric_is_rejected_before_training():
    calls = []
    with pytest.raises(ValueError, match="available: train_loss, val_loss, val_acc"):
        fit(cfg(), mlp(), splits(), metric="val_f1", on_epoch=lambda e, m: calls.append(e))
    with pytest.raises(ValueError, match="imbalance option"):
        fit(cfg(), mlp(), splits(), metric="val_macro_f1")
    with pytest.raises(ValueError, match="direction"):
        fit(cfg(), mlp(), splits(), direction="max")
    assert calls == []


# ---------------------------------------------------------------- gradient accumulation


def test_accumulation_matches_the_large_batch():
    # Linear model, plain SGD, no scheduler: the only difference is how the 32-sample optimizer
    # batches are computed. Same seed => same permutation of the 64 samples in both runs.
    data = splits(n_train=64)
    model = nn.Linear(8, 4)
    small, large = copy.deepcopy(model), copy.deepcopy(model)
    fit(cfg(max_epochs=1, batch_size=8, grad_accum_steps=4, lr=0.5), small, data, seed=3)
    fit(cfg(max_epochs=1, batch_size=32, grad_accum_steps=1, lr=0.5), large, data, seed=3)
    assert not torch.allclose(small.weight, model.weight)  # it trained
    torch.testing.assert_close(small.weight, large.weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(small.bias, large.bias, rtol=1e-5, atol=1e-6)


def test_partial_final_group_is_stepped_with_its_own_mean(tmp_path):
    # 40 samples, micro-batch 8, accumulate 4: groups of 4 and 1 micro-batches -> 2 optimizer steps,
    # the second on the mean over its 8 samples (divided by 1, not 4).
    data = splits(n_train=40)
    model = nn.Linear(8, 4)
    reference = copy.deepcopy(model)
    fit(cfg(max_epochs=1, batch_size=8, grad_accum_steps=4, lr=0.5), model, data, seed=5, checkpoint_dir=tmp_path)

    x, y = data.train.tensors
    order = torch.randperm(40, generator=make_generator(5))  # the order fit draws for epoch 1
    opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for idx in (order[:32], order[32:]):
        opt.zero_grad()
        F.cross_entropy(reference(x[idx]), y[idx]).backward()
        opt.step()
    torch.testing.assert_close(model.weight, reference.weight, rtol=1e-5, atol=1e-6)
    ckpt = load_checkpoint(tmp_path / "last.pt")
    assert ckpt["state"]["global_step"] == 2 and ckpt["state"]["micro_step"] == 5


# ---------------------------------------------------------------- exact resume and determinism


class NoisyInputs:
    """A train_transform drawing from torch's global RNG (like random augmentation)."""

    def __call__(self, x):
        return x + 0.1 * torch.randn_like(x)


@pytest.mark.parametrize(
    "variant",
    [
        dict(optimizer="adamw", lr=0.01, weight_decay=0.01, scheduler="cosine", warmup_epochs=1.0),
        dict(optimizer="sgd", momentum=0.9, nesterov=True, scheduler="plateau", plateau_patience=0, balanced_sampler=True),
        dict(optimizer="adam", lr=0.01, scheduler="onecycle", grad_accum_steps=2, early_stopping_patience=3, _dataloader=True),
    ],
    ids=["adamw-cosine-warmup", "sgd-plateau-sampler", "adam-onecycle-dataloader"],
)
def test_resume_continues_exactly(tmp_path, variant):
    variant = dict(variant)
    use_loader = variant.pop("_dataloader", False)
    data = splits()
    if use_loader:
        data = DataSplits(MapDataset(data.train), MapDataset(data.val), data.test, 4, (8,))
    else:
        data = DataSplits(data.train, data.val, data.test, 4, (8,), train_transform=NoisyInputs())
    config = cfg(max_epochs=4, **variant)

    straight = fit(config, mlp(dropout=0.2, batchnorm=True), data, seed=7, checkpoint_dir=tmp_path / "a")

    # "Interrupted" after epoch 2 (the caller stops it), then resumed into a fresh, differently
    # initialized model: everything must come from the checkpoint.
    first = fit(config, mlp(dropout=0.2, batchnorm=True), data, seed=7, checkpoint_dir=tmp_path / "b", on_epoch=lambda e, m: e == 2)
    assert first.stop_reason == "stopped_by_caller" and first.epochs_run == 2
    notes: list[str] = []
    resumed_model = mlp(seed=123, dropout=0.2, batchnorm=True)
    resumed = fit(config, resumed_model, data, seed=7, checkpoint_dir=tmp_path / "b", resume_from=tmp_path / "b" / "last.pt", log=notes.append)

    assert any("resumed at epoch 3" in n for n in notes)
    assert resumed.epochs_run == 4 and [h["epoch"] for h in resumed.history] == [1, 2, 3, 4]
    for a, b in zip(straight.history[2:], resumed.history[2:]):
        for key in LEARNING_KEYS:
            assert a[key] == b[key], (key, a[key], b[key])  # exact, not approximate
    assert learning(straight.history) == learning(resumed.history)
    assert (straight.best_value, straight.best_epoch) == (resumed.best_value, resumed.best_epoch)
    a_state = load_checkpoint(tmp_path / "a" / "last.pt")["state"]["model"]
    for name, tensor in resumed_model.state_dict().items():
        assert torch.equal(a_state[name], tensor), name


def test_a_checkpoint_read_already_is_not_read_again_and_resumes_exactly(tmp_path):
    # A trial object reads its checkpoint once (trial.resume_checkpoint) and the routine's fit takes it
    # from there: the file is overwritten after that read, so a second read would fail.
    config = cfg(max_epochs=4, optimizer="adamw", lr=0.01, scheduler="cosine")
    straight = fit(config, mlp(), splits(), seed=3, checkpoint_dir=tmp_path / "a")
    fit(config, mlp(), splits(), seed=3, checkpoint_dir=tmp_path / "b", on_epoch=lambda e, m: e == 2)
    last = tmp_path / "b" / "last.pt"
    read = load_checkpoint(last)
    last.write_bytes(b"not a checkpoint any more")
    resumed = fit(config, mlp(seed=9), splits(), seed=3, checkpoint_dir=tmp_path / "c", resume_from=last, resume_checkpoint=read)
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3, 4]
    assert learning(straight.history) == learning(resumed.history)


def test_resume_of_a_finished_run_trains_nothing(tmp_path):
    done = fit(cfg(), mlp(), splits(), checkpoint_dir=tmp_path)
    calls = []
    again = fit(cfg(), mlp(), splits(), resume_from=tmp_path / "last.pt", on_epoch=lambda e, m: calls.append(e))
    assert calls == [] and again.epochs_run == 2 and again.history == done.history


def test_deterministic_runs_are_identical():
    data = DataSplits(splits().train, splits().val, splits().test, 4, (8,), train_transform=NoisyInputs())
    config = cfg(max_epochs=3, optimizer="adamw", lr=0.01, deterministic=True)
    try:
        runs = [fit(config, mlp(dropout=0.3, batchnorm=True), data, seed=11) for _ in range(2)]
        other_seed = fit(config, mlp(dropout=0.3, batchnorm=True), data, seed=12)
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic
    finally:
        seed_everything(0, deterministic=False)
    assert learning(runs[0].history) == learning(runs[1].history)
    assert learning(runs[0].history) != learning(other_seed.history)  # the comparison can tell runs apart
    assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark


# ---------------------------------------------------------------- failure modes


def test_injected_nan_names_the_step():
    with pytest.raises(NonFiniteLossError, match=r"micro-step 8 .*injected") as info:
        fit(cfg(max_epochs=3, inject_nan_at_step=8), mlp(), splits())  # 6 micro-batches per epoch
    assert info.value.step == 8 and info.value.epoch == 2 and math.isnan(info.value.value)


def test_exploding_lr_raises_non_finite_loss():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    with pytest.raises(NonFiniteLossError, match="Lower the lr"):
        fit(cfg(max_epochs=5, lr=1e4, momentum=0.9), model, splits())


def test_injected_oom_raises_cuda_oom_at_that_step():
    seen = []
    with pytest.raises(torch.cuda.OutOfMemoryError, match="injected .* micro-step 7"):
        fit(cfg(max_epochs=3, inject_oom_at_step=7), mlp(), splits(), on_epoch=lambda e, m: seen.append(e))
    assert seen == [1]  # epoch 1 had micro-steps 0..5


def test_gradient_clipping_is_applied_and_norm_is_pre_clipping():
    model = nn.Linear(8, 4)
    before = copy.deepcopy(model)
    result = fit(cfg(max_epochs=1, lr=1.0, grad_clip_norm=1e-6), model, splits())
    assert result.history[0]["grad_norm"] > 1e-3  # measured before clipping
    moved = torch.cat([(a - b).flatten() for a, b in zip(model.parameters(), before.parameters())]).norm()
    assert 0 < moved <= 6 * 1e-6 * 1.01  # 6 steps of at most lr * max_norm each


# ---------------------------------------------------------------- data paths and imbalance


@pytest.mark.parametrize(
    "options",
    [dict(class_weighting="inverse_freq"), dict(balanced_sampler=True), dict(focal_gamma=2.0, label_smoothing=0.1, class_weighting="inverse_freq")],
    ids=["inverse_freq", "balanced_sampler", "focal"],
)
def test_imbalance_options_report_macro_f1_and_recall(options):
    data = splits(n_train=160, weights=[0.7, 0.1, 0.1, 0.1])
    result = fit(cfg(max_epochs=2, **options), mlp(), data, metric="val_macro_f1")
    m = result.last_metrics
    assert {"val_macro_f1", "val_recall_0", "val_recall_1", "val_recall_2", "val_recall_3"} <= set(m)
    assert all(0 <= m[f"val_recall_{c}"] <= 1 for c in range(4)) and 0 <= m["val_macro_f1"] <= 1
    assert result.best_value == max(h["val_macro_f1"] for h in result.history)


def test_balanced_sampling_draws_classes_evenly():
    labels = torch.tensor([0] * 90 + [1] * 10)
    weights = (1.0 / torch.bincount(labels).double())[labels]
    batches = TensorBatches(torch.zeros(100, 1), labels, 1000, shuffle=True, generator=make_generator(0), sample_weights=weights)
    drawn = torch.cat([y for _, y in batches])
    share_of_rare = float((drawn == 1).float().mean())
    assert 0.35 < share_of_rare < 0.65  # 0.1 without the sampler


def test_in_memory_drop_last_only_with_more_than_one_batch():
    x, y = torch.zeros(20, 1), torch.zeros(20, dtype=torch.long)
    assert [len(b[1]) for b in TensorBatches(x, y, 8, shuffle=True, generator=make_generator(0), drop_last=True)] == [8, 8]
    assert [len(b[1]) for b in TensorBatches(x, y, 32, shuffle=True, generator=make_generator(0), drop_last=True)] == [20]
    assert [len(b[1]) for b in TensorBatches(x, y, 8)] == [8, 8, 4]  # validation keeps every sample


def test_dataloader_path_with_workers():
    base = splits()
    data = DataSplits(MapDataset(base.train), MapDataset(base.val), base.test, 4, (8,))
    result = fit(cfg(max_epochs=2, num_workers=1, balanced_sampler=True), mlp(), data)
    assert result.epochs_run == 2 and 0 <= result.last_metrics["val_acc"] <= 1


def test_bf16_autocast_on_cpu_when_asked():
    result = fit(cfg(amp="bf16"), mlp(), splits())
    assert result.amp == "bf16" and math.isfinite(result.last_metrics["val_loss"])
    assert fit(cfg(amp="auto"), mlp(), splits()).amp == "off"  # auto: no autocast on the CPU


def test_evaluate_in_memory_and_dataset_agree_and_restore_mode():
    data = splits()
    model = mlp(dropout=0.5)
    model.train()
    a = evaluate(model, data.val, num_classes=4)
    b = evaluate(model, MapDataset(data.val), num_classes=4, batch_size=7)
    assert model.training  # mode restored
    assert set(a) == {"loss", "acc", "macro_f1", "recall", "n"} and a["n"] == 48 and len(a["recall"]) == 4
    assert a["acc"] == b["acc"] and a["recall"] == b["recall"] and a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    # eval mode: dropout off, so two evaluations agree
    assert evaluate(model, data.val, num_classes=4)["loss"] == a["loss"]


# ---------------------------------------------------------------- real data


def test_digits_cnn_learns():
    from experiments import digits_cnn

    data = digits_cnn.load_data(dict(digits_cnn.DATA_DEFAULTS), data_seed=0)
    seed_everything(0)
    model = digits_cnn.build_model(dict(digits_cnn.MODEL_DEFAULTS), data.input_shape, data.num_classes)
    result = fit(TrainConfig(max_epochs=8, optimizer="adamw", lr=3e-3, device="cpu"), model, data, seed=0)
    assert result.best_value >= 0.9, result.history
    test = evaluate(model, data.test, num_classes=10)
    assert test["acc"] >= 0.85
