"""experiments/fashion_mnist.py against tiny IDX files read by the real torchvision FashionMNIST code."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from torchvision.datasets import FashionMNIST

from experiments import fashion_mnist as fm
from hpolab.train.data import DataSplits, labels_of

N_TRAIN, N_TEST = 60, 20


def _idx_images(images: np.ndarray) -> bytes:
    n, h, w = images.shape
    return struct.pack(">IIII", 0x00000803, n, h, w) + images.astype(np.uint8).tobytes()


def _idx_labels(labels: np.ndarray) -> bytes:
    return struct.pack(">II", 0x00000801, len(labels)) + labels.astype(np.uint8).tobytes()


def _write_fashion_mnist(root: Path, gz: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    """Write train/test IDX files where torchvision looks for them: <root>/FashionMNIST/raw/."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train_x": rng.integers(0, 256, (N_TRAIN, 28, 28), dtype=np.uint8),
        "train_y": rng.permutation(np.arange(N_TRAIN) % 10).astype(np.uint8),  # 6 per class
        "test_x": rng.integers(0, 256, (N_TEST, 28, 28), dtype=np.uint8),
        "test_y": rng.permutation(np.arange(N_TEST) % 10).astype(np.uint8),
    }
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    blobs = {
        "train-images-idx3-ubyte": _idx_images(arrays["train_x"]),
        "train-labels-idx1-ubyte": _idx_labels(arrays["train_y"]),
        "t10k-images-idx3-ubyte": _idx_images(arrays["test_x"]),
        "t10k-labels-idx1-ubyte": _idx_labels(arrays["test_y"]),
    }
    for name, blob in blobs.items():
        if gz:
            with gzip.open(raw / f"{name}.gz", "wb") as f:
                f.write(blob)
        else:
            (raw / name).write_bytes(blob)
    return arrays


def _data(root: Path, **over) -> dict:
    return {**fm.DATA_DEFAULTS, "root": str(root), **over}


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    def refuse(self):
        raise AssertionError("FashionMNIST.download() was called")

    monkeypatch.setattr(FashionMNIST, "download", refuse)


@pytest.fixture
def fmnist(tmp_path):
    return tmp_path, _write_fashion_mnist(tmp_path)


def test_fixture_files_are_what_torchvision_reads(fmnist):
    root, arrays = fmnist
    ds = FashionMNIST(str(root), train=True)
    assert torch.equal(ds.data, torch.from_numpy(arrays["train_x"]))
    assert torch.equal(ds.targets, torch.from_numpy(arrays["train_y"]).long())


def test_load_data_splits(fmnist):
    root, arrays = fmnist
    splits = fm.load_data(_data(root), data_seed=0)
    assert isinstance(splits, DataSplits)
    assert splits.num_classes == 10 and splits.input_shape == (1, 28, 28)
    assert splits.class_names == tuple(FashionMNIST.classes)
    assert splits.preprocess is fm.preprocess and splits.train_transform is None
    # val_fraction 0.1, stratified: one image of each class (6 per class) -> 10 val, 50 train
    assert (len(splits.train), len(splits.val), len(splits.test)) == (50, 10, N_TEST)
    assert splits.info["n_train"] == 50 and splits.info["n_val"] == 10 and splits.info["n_test"] == N_TEST
    tr, va = set(splits.train.indices), set(splits.val.indices)
    assert not tr & va and tr | va == set(range(N_TRAIN))
    assert sorted(arrays["train_y"][sorted(va)].tolist()) == list(range(10))
    # labels come from the files (through __getitem__ and through the cheap `targets`)
    for view in (splits.train, splits.val):
        got = [view[i][1] for i in range(len(view))]
        assert got == arrays["train_y"][view.indices].tolist()
        assert labels_of(view).tolist() == got
    assert [splits.test[i][1] for i in range(N_TEST)] == arrays["test_y"].tolist()
    # val images are un-augmented: exactly preprocess(raw)
    for i, j in enumerate(splits.val.indices):
        assert torch.equal(splits.val[i][0], fm.preprocess(torch.from_numpy(arrays["train_x"][j : j + 1]))[0])


def test_split_is_fixed_by_seed(fmnist):
    root, _ = fmnist
    a, b, c = (fm.load_data(_data(root), data_seed=s) for s in (0, 0, 1))
    assert a.val.indices == b.val.indices and a.train.indices == b.train.indices
    assert a.val.indices != c.val.indices


def test_limit_train_subsamples_train_only(fmnist):
    root, _ = fmnist
    full = fm.load_data(_data(root), data_seed=3)
    small = fm.load_data(_data(root, limit_train=20), data_seed=3)
    assert len(small.train) == 20 and small.info["n_train"] == 20
    assert small.val.indices == full.val.indices
    assert set(small.train.indices) <= set(full.train.indices)
    with pytest.raises(ValueError, match="limit_train"):
        fm.load_data(_data(root, limit_train=0), data_seed=3)


def test_train_view_is_augmented_and_switchable(fmnist):
    root, arrays = fmnist
    plain = fm.load_data(_data(root, augment=False), data_seed=0)
    j = plain.train.indices[0]
    expected = fm.preprocess(torch.from_numpy(arrays["train_x"][j : j + 1]))[0]
    assert torch.equal(plain.train[0][0], expected)

    torch.manual_seed(0)
    aug = fm.load_data(_data(root, augment=True, crop_padding=2, hflip=True), data_seed=0)
    assert aug.train.indices == plain.train.indices
    draws = [aug.train[0][0] for _ in range(20)]
    assert all(d.shape == (1, 28, 28) and d.dtype == torch.float32 for d in draws)
    assert any(not torch.equal(d, expected) for d in draws)  # random crop/flip happened
    # every draw is a 28x28 window of the image zero-padded by 2 (black, i.e. normalized -MEAN/STD), maybe flipped
    padded = torch.nn.functional.pad(expected, (2, 2, 2, 2), value=(0.0 - fm.MEAN) / fm.STD)
    candidates = [w for dy in range(5) for dx in range(5) for w in (padded[:, dy : dy + 28, dx : dx + 28],)]
    candidates += [w.flip(-1) for w in candidates]
    for d in draws:
        assert any(torch.allclose(d, w, rtol=0, atol=1e-6) for w in candidates)


def test_missing_files_without_download_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        fm.load_data(_data(tmp_path / "nowhere"), data_seed=0)
    msg = str(err.value)
    assert "nowhere" in msg and "download=true" in msg and "train-images-idx3-ubyte" in msg

    _write_fashion_mnist(tmp_path / "partial")
    (tmp_path / "partial" / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        fm.load_data(_data(tmp_path / "partial"), data_seed=0)


def test_gzipped_files_are_used_offline(tmp_path):
    arrays = _write_fashion_mnist(tmp_path, gz=True)
    splits = fm.load_data(_data(tmp_path), data_seed=0)
    assert len(splits.test) == N_TEST
    assert [splits.test[i][1] for i in range(N_TEST)] == arrays["test_y"].tolist()


def test_preprocess_matches_the_eval_dataset_transform(fmnist):
    root, arrays = fmnist
    splits = fm.load_data(_data(root), data_seed=0)
    raw = torch.from_numpy(arrays["test_x"])  # (N, 28, 28) uint8
    batch = fm.preprocess(raw)
    assert batch.shape == (N_TEST, 1, 28, 28) and batch.dtype == torch.float32
    from_dataset = torch.stack([splits.test[i][0] for i in range(N_TEST)])
    assert type(from_dataset) is torch.Tensor
    torch.testing.assert_close(batch, from_dataset, rtol=0, atol=1e-6)
    assert torch.equal(fm.preprocess(raw.unsqueeze(1)), batch)
    # the documented statistics: pixel 0 -> -MEAN/STD, pixel 255 -> (1-MEAN)/STD
    edge = fm.preprocess(torch.tensor([[[0] * 28] * 28, [[255] * 28] * 28], dtype=torch.uint8))
    torch.testing.assert_close(edge[0].flatten()[0], torch.tensor(-0.2860 / 0.3530))
    torch.testing.assert_close(edge[1].flatten()[0], torch.tensor((1 - 0.2860) / 0.3530))
    with pytest.raises(TypeError):
        fm.preprocess(raw.float())
    with pytest.raises(ValueError):
        fm.preprocess(torch.zeros(2, 3, 28, 28, dtype=torch.uint8))


@pytest.mark.parametrize("arch", ["resnet18", "small_cnn"])
def test_build_model_gives_logits(arch):
    torch.manual_seed(0)
    model_cfg = {**fm.MODEL_DEFAULTS, "arch": arch, "width": 8, "channels": 8}
    net = fm.build_model(model_cfg, (1, 28, 28), 10)
    net.eval()
    with torch.no_grad():
        out = net(torch.randn(2, 1, 28, 28))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_resnet18_is_torchvision_adapted_to_28x28():
    net = fm.build_model(dict(fm.MODEL_DEFAULTS), (1, 28, 28), 10)
    assert isinstance(net, torchvision.models.ResNet)
    assert net.conv1.in_channels == 1 and net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
    assert isinstance(net.maxpool, torch.nn.Identity)
    assert net.layer4[-1].conv2.out_channels == 512  # width 64 = the standard ResNet-18
    narrow = fm.build_model({**fm.MODEL_DEFAULTS, "width": 16}, (1, 28, 28), 10)
    assert narrow.layer1[0].conv1.out_channels == 16 and narrow.layer4[-1].conv2.out_channels == 128
    assert sum(p.numel() for p in narrow.parameters()) < sum(p.numel() for p in net.parameters()) / 10
    with pytest.raises(ValueError, match="arch"):
        fm.build_model({**fm.MODEL_DEFAULTS, "arch": "vgg"}, (1, 28, 28), 10)


def test_short_fit_end_to_end(fmnist):
    from hpolab.train import fit  # the shared training routine
    from hpolab.train.config import TrainConfig

    root, _ = fmnist
    torch.manual_seed(0)
    data = fm.load_data(_data(root), data_seed=0)
    model = fm.build_model({**fm.MODEL_DEFAULTS, "arch": "small_cnn", "channels": 8}, data.input_shape, data.num_classes)
    cfg = TrainConfig(max_epochs=1, batch_size=16, device="cpu")
    result = fit(cfg, model, data, metric="val_acc", direction="maximize", seed=0)
    assert isinstance(result.history, list) and len(result.history) == 1
    last = result.history[-1]
    assert last["epoch"] == 1 and 0.0 <= last["val_acc"] <= 1.0
    assert result.epochs_run == 1 and result.best_value == last["val_acc"]
