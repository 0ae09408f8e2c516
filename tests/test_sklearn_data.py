"""The bundled-data reader the example experiments use equals scikit-learn's own loaders, and an
experiment's import does not import scikit-learn (the reason the reader exists)."""

import subprocess
import sys

import numpy as np
from sklearn.datasets import load_diabetes, load_digits

from hpolab.train import sklearn_data
from conftest import ROOT


def test_digits_equal_sklearns():
    images, target = sklearn_data.load_digits()
    bunch = load_digits()
    np.testing.assert_array_equal(images, bunch.images)
    np.testing.assert_array_equal(target, bunch.target)
    assert images.dtype == bunch.images.dtype and target.dtype == bunch.target.dtype


def test_diabetes_equal_sklearns_raw_units():
    data, target = sklearn_data.load_diabetes_raw()
    bunch = load_diabetes(scaled=False)
    np.testing.assert_array_equal(data, bunch.data)
    np.testing.assert_array_equal(target, bunch.target)


def test_importing_and_loading_an_example_experiment_leaves_sklearn_unimported():
    code = ("import sys; from hpolab.config.experiment import load_experiment\n"
            "for name in ('digits_cnn', 'diabetes_mlp', 'digits_multilabel'):\n"
            "    exp = load_experiment(name); exp.load_data(dict(exp.DATA_DEFAULTS, augment=False), 0)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
