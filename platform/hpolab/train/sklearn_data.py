"""scikit-learn's bundled datasets (digits, diabetes), read from the files scikit-learn ships, without
importing scikit-learn.

Why: `import sklearn.datasets` pulls in scipy and most of scikit-learn, about 1 s of CPU in every process
that imports an experiment (each `hpolab study run`, `promote`, `predict`, `reproduce`, ...), for two
small CSV files. The arrays are those `sklearn.datasets.load_digits()` and `load_diabetes(scaled=False)`
return (tests/test_sklearn_data.py compares them); scikit-learn must still be installed: the files are its.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np


def _data_file(name: str) -> Path:
    spec = importlib.util.find_spec("sklearn")  # where the package is, without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("scikit-learn is not installed: the digits and diabetes data come with it (pip install scikit-learn)")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / name


def _load_csv_gz(name: str, delimiter: str | None = None) -> np.ndarray:
    with gzip.open(_data_file(name), "rt", encoding="utf-8") as f:
        return np.loadtxt(f, delimiter=delimiter)


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images float64 (1797, 8, 8) with integer values 0..16, target int (1797,)): load_digits()'s
    `images` and `target` (its `data` is `images.reshape(-1, 64)`)."""
    data = _load_csv_gz("digits.csv.gz", delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def load_diabetes_raw() -> tuple[np.ndarray, np.ndarray]:
    """(data float64 (442, 10) in raw units, target float64 (442,)): load_diabetes(scaled=False)'s."""
    return _load_csv_gz("diabetes_data_raw.csv.gz"), _load_csv_gz("diabetes_target.csv.gz")
