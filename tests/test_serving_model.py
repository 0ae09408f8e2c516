"""The serving model without a registry: the table its pyfunc returns per task (what `hpolab predict`
prints), raw inputs from an image folder, the uint8 image path through ONNX and TorchScript with
parity, and the digits experiment's raw test split. The promote -> registry -> predict flow on a real
store is tests/test_promote.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_the_served_table_per_task():
    """hpolab_pyfunc.output_frame: what the champion's pyfunc returns and predict prints."""
    from hpolab.registry.hpolab_pyfunc import output_frame

    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0]])
    t = output_frame("classification", logits, ["cat", "dog", "eel"])
    assert list(t.columns) == ["class", "label", "prob_cat", "prob_dog", "prob_eel"]
    assert t["class"].tolist() == [0, 1] and t["label"].tolist() == ["cat", "dog"]
    assert np.allclose(t[["prob_cat", "prob_dog", "prob_eel"]].to_numpy(), torch.softmax(logits, 1).numpy())
    # no names, or names that cannot be columns (too few, repeated): the indices
    assert list(output_frame("classification", logits, ["a", "a", "b"]).columns)[2:] == ["prob_0", "prob_1", "prob_2"]
    assert output_frame("classification", logits)["label"].tolist() == ["0", "1"]
    m = output_frame("multilabel", torch.tensor([[0.2, 0.7], [0.35, 0.1]]), ["x", "y"], threshold=0.3)
    assert list(m.columns) == ["label_x", "label_y", "prob_x", "prob_y"]
    assert m[["label_x", "label_y"]].to_numpy().tolist() == [[0, 1], [1, 0]]
    assert list(output_frame("regression", torch.tensor([[150.0], [80.0]])).columns) == ["prediction"]
    assert list(output_frame("regression", torch.zeros(2, 2), ["sys", "dia"]).columns) == ["prediction_sys", "prediction_dia"]
    raw = output_frame("custom", torch.ones(2, 4, 4))
    assert isinstance(raw, np.ndarray) and raw.shape == (2, 4, 4)


def test_image_folder_becomes_raw_uint8_inputs(tmp_path):
    from PIL import Image

    from hpolab.errors import UserError
    from hpolab.registry.predict import _cast, _load_images

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (28, 28), dtype=np.uint8)
    Image.fromarray(a).save(tmp_path / "b.png")
    Image.fromarray(np.stack([a] * 3, -1)).resize((56, 40)).save(tmp_path / "a.jpg")
    (tmp_path / "notes.txt").write_text("not an image")
    x, names = _load_images(tmp_path, (28, 28), np.dtype(np.uint8))
    assert names == ["a.jpg", "b.png"] and x.shape == (2, 28, 28) and x.dtype == np.uint8
    assert np.array_equal(x[1], a)  # grayscale at the right size: unchanged
    assert _cast(np.array([[0.0, 255.0]]), np.dtype(np.uint8), "x").dtype == np.uint8
    with pytest.raises(UserError, match="0..255"):
        _cast(np.array([[0.5, 0.25]]), np.dtype(np.uint8), "x")


# ----------------------------------------------------------------------------- serving + export


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_fashion_serving_model_takes_uint8_and_exports_with_parity(tmp_path, exporter):
    """The uint8 image path (Fashion-MNIST's preprocess inside the model) through ONNX and TorchScript,
    with either ONNX exporter (promote falls back to the torch.export-based one)."""
    from experiments import fashion_mnist as fm
    from hpolab.registry.export import export_onnx, export_torchscript, onnx_max_abs_diff, torchscript_max_abs_diff
    from hpolab.registry.serving import ServingModel, predict_logits

    torch.manual_seed(0)
    net = fm.build_model({**fm.MODEL_DEFAULTS, "arch": "small_cnn", "channels": 4}, (1, 28, 28), 10)
    serving = ServingModel(fm.preprocess, net).eval()
    raw = np.random.default_rng(0).integers(0, 256, (37, 28, 28), dtype=np.uint8)
    ref = predict_logits(serving, raw).numpy()
    with torch.no_grad():
        assert np.allclose(ref, net(fm.preprocess(torch.from_numpy(raw))).numpy(), atol=1e-6)
    example = torch.from_numpy(raw[:4])
    path, used = export_onnx(serving, example, tmp_path / "m.onnx", exporters=(exporter,))
    assert used == exporter
    assert onnx_max_abs_diff(path, raw, ref) <= 1e-4  # 37 samples: another batch size than the example's 4
    assert onnx_max_abs_diff(path, raw, ref + 1e-3) > 1e-4  # the check compares, it does not just run
    if exporter == "torchscript":
        assert torchscript_max_abs_diff(export_torchscript(serving, example, tmp_path / "m.pt"), raw, ref) <= 1e-4


def test_digits_raw_test_is_the_test_split():
    from experiments import digits_cnn

    data = digits_cnn.load_data(digits_cnn.DATA_DEFAULTS, 0)
    x, y = digits_cnn.raw_test(digits_cnn.DATA_DEFAULTS, 0)
    xt, yt = data.test.tensors
    assert x.dtype == np.float32 and x.shape[1:] == (8, 8) and x.min() >= 0 and x.max() <= 16
    assert torch.equal(digits_cnn.preprocess(torch.from_numpy(x)), xt) and np.array_equal(y, yt.numpy())
