"""Fashion-MNIST through torchvision's own dataset class, with a ResNet-18 (adapted to 28x28) or a small CNN.

Data: the four official IDX files (60,000 train and 10,000 test images, 28x28 grayscale, 10 classes),
read by `torchvision.datasets.FashionMNIST` from `<data.root>/FashionMNIST/raw/`:

    train-images-idx3-ubyte  train-labels-idx1-ubyte  t10k-images-idx3-ubyte  t10k-labels-idx1-ubyte

`data.root` is an absolute path, or one relative to the project folder (the one holding experiments/;
the default "data" is its data/ folder): a trial runs in its own folder, not where the command was
started. Nothing is downloaded unless `data.download: true`: with the default, missing
files raise a FileNotFoundError naming the folder. Files that are present only gzipped (`*.gz`, as
published) are decompressed next to themselves first, offline.

Splits (fixed by the data seed): val is a stratified `data.val_fraction` of the official train set, train is
the rest (optionally subsampled to `data.limit_train` images for quick runs), test is the official test
set. Train and val are two views of the same files with different transforms: train gets the geometric
augmentation (random crop with zero padding, horizontal flip), val and test only the eval transform
(to float in [0, 1], then normalize with the Fashion-MNIST train statistics). `preprocess` applies exactly
that eval transform to raw uint8 images, so inference matches training.
"""

from __future__ import annotations

import gzip
import os
import shutil
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, Subset

from hpolab.train.data import DataSplits
from hpolab.train.layers import GlobalAvgPool

try:  # torchvision >= 0.16
    from torchvision.transforms import v2 as T

    _V2 = True
except ImportError:  # pragma: no cover - old torchvision
    from torchvision import transforms as T

    _V2 = False

DATA_DEFAULTS = {
    "root": "data",  # folder holding FashionMNIST/raw/<IDX files>; relative to the project folder
    "download": False,  # true: fetch the files from the official mirror if missing (needs network)
    "val_fraction": 0.1,  # stratified share of the official train set held out for validation
    "limit_train": None,  # int: keep only this many (seeded-random) training images; null = all
    "augment": True,  # false: train on the eval transform (no random crop/flip)
    "crop_padding": 2,  # random crop 28x28 from the image zero-padded by this many pixels; 0 = no crop
    "hflip": True,  # random horizontal flip (with augment)
}

MODEL_DEFAULTS = {
    "arch": "resnet18",  # "resnet18" (torchvision ResNet-18, 3x3 stride-1 stem, no max-pool) or "small_cnn"
    "width": 64,  # resnet18: channels of the first stage (64 = standard); stages use width x 1, 2, 4, 8
    "channels": 32,  # small_cnn: channels of the first block; x2 per block (3 blocks)
    "dropout": 0.1,  # both: dropout before the final linear layer
}

ARCHS = ("resnet18", "small_cnn")
MEAN = 0.2860  # Fashion-MNIST train-set pixel mean / std, on the [0, 1] scale
STD = 0.3530
IMAGE_SIZE = 28
RAW_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


# ----------------------------------------------------------------------------------------- transforms


def eval_transform():
    """PIL image (as the dataset yields it) -> float tensor (1, 28, 28), normalized. Val, test, inference."""
    if _V2:
        return T.Compose([T.ToImage(), T.ToDtype(torch.float32, scale=True), T.Normalize([MEAN], [STD]), T.ToPureTensor()])
    return T.Compose([T.ToTensor(), T.Normalize([MEAN], [STD])])


def train_transform(augment: bool, crop_padding: int, hflip: bool):
    """The eval transform with geometric augmentation first (on the uint8 image, so padding is black)."""
    if not augment:
        return eval_transform()
    geometric: list[Any] = []
    if crop_padding > 0:
        geometric.append(T.RandomCrop(IMAGE_SIZE, padding=int(crop_padding), fill=0))
    if hflip:
        geometric.append(T.RandomHorizontalFlip())
    if _V2:
        return T.Compose([T.ToImage(), *geometric, T.ToDtype(torch.float32, scale=True), T.Normalize([MEAN], [STD]), T.ToPureTensor()])
    return T.Compose([*geometric, T.ToTensor(), T.Normalize([MEAN], [STD])])


def preprocess(raw: torch.Tensor) -> torch.Tensor:
    """Raw uint8 images (N, 28, 28) or (N, 1, 28, 28), values 0..255 -> model input (N, 1, 28, 28).

    Exactly the eval transform: scale to [0, 1] the way the transform does, then (x - MEAN) / STD.
    """
    x = torch.as_tensor(raw)
    if x.dtype != torch.uint8:
        raise TypeError(f"preprocess expects raw uint8 images (0..255), got dtype {x.dtype}")
    if x.ndim == 2:
        x = x.unsqueeze(0)
    if x.ndim == 3:
        x = x.unsqueeze(1)
    if x.ndim != 4 or tuple(x.shape[1:]) != (1, IMAGE_SIZE, IMAGE_SIZE):
        raise ValueError(f"preprocess expects (N, 28, 28) or (N, 1, 28, 28) images, got shape {tuple(torch.as_tensor(raw).shape)}")
    if _V2:
        x = x.to(torch.float32).mul_(1.0 / 255)  # = v2.ToDtype(float32, scale=True)
    else:
        x = x.to(torch.float32).div(255)  # = v1.ToTensor
    return x.sub_(MEAN).div_(STD)  # = Normalize


# ----------------------------------------------------------------------------------------------- data


class _SplitView(Subset):
    """A Subset that keeps `targets` and `classes`, so label statistics need not decode every image."""

    def __init__(self, dataset: Dataset, indices: np.ndarray) -> None:
        super().__init__(dataset, [int(i) for i in indices])
        self.targets = torch.as_tensor(dataset.targets)[torch.as_tensor(indices, dtype=torch.long)]
        self.classes = list(getattr(dataset, "classes", []))


def _ensure_files(root: str, download: bool) -> None:
    """Make sure torchvision will find the raw files, or fail with a message that says what to do."""
    from torchvision.datasets import FashionMNIST

    folder = os.path.join(root, FashionMNIST.__name__)
    if all(os.path.isfile(os.path.join(folder, "processed", f)) for f in ("training.pt", "test.pt")):
        return  # torchvision's legacy cache, which it still reads
    raw = os.path.join(folder, "raw")
    for name in RAW_FILES:  # published files are gzipped; torchvision reads them uncompressed
        path = os.path.join(raw, name)
        if not os.path.isfile(path) and os.path.isfile(path + ".gz"):
            tmp = path + ".partial"
            with gzip.open(path + ".gz", "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(tmp, path)
    missing = [n for n in RAW_FILES if not os.path.isfile(os.path.join(raw, n))]
    if missing and not download:
        raise FileNotFoundError(
            f"Fashion-MNIST not found: data.root={root!r} (resolved to {os.path.abspath(raw)}) lacks "
            f"{', '.join(missing)}. Place the four IDX files there (uncompressed or .gz), or set "
            f"data.download=true to fetch them (needs network)."
        )


def _stratified_split(y: np.ndarray, val_fraction: float, rng: np.random.Generator):
    train, val = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_val = int(round(len(idx) * val_fraction))
        val.append(idx[:n_val])
        train.append(idx[n_val:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def _root(data: dict) -> str:
    """data.root, a relative one read from the project folder (this file's parent's parent)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.fspath(data["root"]))


def load_data(data: dict, data_seed: int) -> DataSplits:
    from torchvision.datasets import FashionMNIST

    root = _root(data)
    download = bool(data["download"])
    val_fraction = float(data["val_fraction"])
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"data.val_fraction must be in (0, 1), got {val_fraction}")
    limit = data["limit_train"]
    if limit is not None and int(limit) < 1:
        raise ValueError(f"data.limit_train must be >= 1, or null for all, got {limit}")
    crop_padding = int(data["crop_padding"])
    if crop_padding < 0:
        raise ValueError(f"data.crop_padding must be >= 0, got {crop_padding}")

    _ensure_files(root, download)
    # Two views of the official train files: augmented (for train) and plain (for val).
    train_aug = FashionMNIST(root, train=True, download=download,
                             transform=train_transform(bool(data["augment"]), crop_padding, bool(data["hflip"])))
    train_plain = FashionMNIST(root, train=True, download=False, transform=eval_transform())
    test = FashionMNIST(root, train=False, download=False, transform=eval_transform())

    rng = np.random.default_rng(data_seed)
    train_idx, val_idx = _stratified_split(train_plain.targets.numpy(), val_fraction, rng)
    if limit is not None and int(limit) < len(train_idx):
        train_idx = np.sort(rng.choice(train_idx, size=int(limit), replace=False))

    return DataSplits(
        train=_SplitView(train_aug, train_idx),
        val=_SplitView(train_plain, val_idx),
        test=test,
        num_classes=len(FashionMNIST.classes),
        input_shape=(1, IMAGE_SIZE, IMAGE_SIZE),
        class_names=tuple(train_plain.classes),
        train_transform=None,  # the train dataset carries its own augmentation
        preprocess=preprocess,
        info={
            "source": "torchvision.datasets.FashionMNIST",
            "root": os.path.abspath(root),
            "n_train": len(train_idx),
            "n_val": len(val_idx),
            "n_test": len(test),
            "transforms": "v2" if _V2 else "v1",
            "normalize": {"mean": MEAN, "std": STD},
        },
    )


def raw_test(data: dict, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The official test set as the user has it: (uint8 images (N, 28, 28), int64 labels (N,)), in the
    order of load_data(data, data_seed).test (the data seed does not change the test split)."""
    from torchvision.datasets import FashionMNIST

    root = _root(data)
    _ensure_files(root, bool(data["download"]))
    test = FashionMNIST(root, train=False, download=False)
    return test.data.numpy().astype(np.uint8), test.targets.numpy().astype(np.int64)


# ---------------------------------------------------------------------------------------------- models


def _resnet18(in_ch: int, num_classes: int, width: int, dropout: float) -> nn.Module:
    from torchvision.models import resnet18
    from torchvision.models.resnet import BasicBlock

    net = resnet18(weights=None, num_classes=num_classes)  # never pretrained: no downloads
    if width != 64:  # rebuild the four stages at another width (torchvision fixes 64 for BasicBlock nets)
        net.inplanes = width
        net.bn1 = nn.BatchNorm2d(width)
        net.layer1 = net._make_layer(BasicBlock, width, 2)
        net.layer2 = net._make_layer(BasicBlock, width * 2, 2, stride=2)
        net.layer3 = net._make_layer(BasicBlock, width * 4, 2, stride=2)
        net.layer4 = net._make_layer(BasicBlock, width * 8, 2, stride=2)
    # 28x28 inputs: a 3x3 stride-1 stem and no max-pool (28 -> 28 -> 14 -> 7 -> 4 over the stages).
    net.conv1 = nn.Conv2d(in_ch, width, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    net.fc = nn.Sequential(nn.Dropout(dropout), nn.Linear(width * 8, num_classes))
    net.avgpool = GlobalAvgPool(keepdim=True)  # deterministic CUDA backward (see hpolab.train.layers)
    for m in net.modules():  # torchvision's own initialization, for the replaced modules too
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)
    return net


def _small_cnn(in_ch: int, num_classes: int, channels: int, dropout: float) -> nn.Module:
    def conv(i: int, o: int) -> list[nn.Module]:
        return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True)]

    c = channels
    return nn.Sequential(
        *conv(in_ch, c), *conv(c, c), nn.MaxPool2d(2),  # 28 -> 14
        *conv(c, 2 * c), *conv(2 * c, 2 * c), nn.MaxPool2d(2),  # 14 -> 7
        *conv(2 * c, 4 * c),
        GlobalAvgPool(), nn.Dropout(dropout), nn.Linear(4 * c, num_classes),
    )


def build_model(model: dict, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    arch = str(model["arch"])
    dropout = float(model["dropout"])
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"model.dropout must be in [0, 1), got {dropout}")
    in_ch = int(input_shape[0])
    if arch == "resnet18":
        width = int(model["width"])
        if width < 1:
            raise ValueError(f"model.width must be >= 1, got {width}")
        return _resnet18(in_ch, num_classes, width, dropout)
    if arch == "small_cnn":
        channels = int(model["channels"])
        if channels < 1:
            raise ValueError(f"model.channels must be >= 1, got {channels}")
        return _small_cnn(in_ch, num_classes, channels, dropout)
    raise ValueError(f"model.arch must be one of {ARCHS}, got {arch!r}")
