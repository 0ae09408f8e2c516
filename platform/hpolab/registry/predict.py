"""`hpolab predict MODEL_URI INPUT [--out FILE]`: class predictions from a promoted model.

MODEL_URI is a registry URI (models:/NAME@ALIAS, models:/NAME/VERSION) or a logged serving model
(models:/m-<id>) written by `hpolab promote`. Its model takes RAW inputs (preprocessing is inside,
see hpolab.registry.serving), and its tags say which: hpolab.raw_input_shape / hpolab.raw_input_dtype,
plus hpolab.class_names.

INPUT is
- a .npy of raw inputs, (N, *raw_shape) or one sample (*raw_shape), e.g. digits: float 0..16 (8, 8);
  values are cast to the raw dtype (to an integer dtype only if they are integers in its range);
- or a folder of images, for models whose raw input is uint8 images ((H, W) grayscale, or (C, H, W)
  with C = 1 or 3): each file is converted to that many channels and resized to H x W.

Output: one line per input: `input` (its index, or the file name), then exactly the columns the
champion's pyfunc returns (hpolab_pyfunc.output_frame, by the model's task, tag hpolab.task):
classification: class, label, prob_<class>...; multilabel: label_<l> (0/1 at the study's threshold),
prob_<l>...; regression: prediction (or prediction_<t>) in the target's units; custom: the
served outputs (output_<c>). Tab-separated on stdout; --out FILE.csv (the same columns, comma-separated) / FILE.npy
(class indices, int64, for classification; else the served values).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hpolab.stores.paths import Stores

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm"}


@dataclass(frozen=True)
class Predictions:
    """A promoted model's predictions: `table` is what `hpolab predict` prints (see the module docstring)."""

    table: Any  # pandas DataFrame: input, then the pyfunc's columns
    served: Any  # torch.Tensor: the serving model's outputs (logits, probabilities or values)
    task: str  # the model's task (tag hpolab.task)
    threshold: float  # multilabel: a label is on at this probability
    source: str  # which model answered ("digits-cnn version 3")


def predict_cmd(args, stores: Stores) -> int:
    from hpolab.errors import UserError

    out = Path(args.out) if args.out else None
    if out is not None and out.suffix.lower() not in (".csv", ".npy"):
        raise UserError(f"--out {out}: use a .csv or .npy file name")
    p = predictions(args.model_uri, Path(args.input), stores)
    at = f", labels at probability >= {p.threshold:g}" if p.task == "multilabel" else ""
    print(f"{len(p.table)} predictions ({p.task}{at}) from {p.source}", file=sys.stderr)
    _write(out, _npy_array(p.task, p.served), p.table)
    return 0


def predictions(model_uri: str, inputs: Any, stores: Stores) -> Predictions:
    """`hpolab predict MODEL_URI INPUT` (and hpolab.predict): `inputs` is a .npy file or a folder of
    images (a Path), or an array of raw inputs (N, *raw_shape) or one sample (*raw_shape)."""
    import mlflow
    import mlflow.pytorch

    from hpolab.errors import UserError
    from hpolab.registry.serving import TAG_CLASS_NAMES, TAG_RAW_DTYPE, TAG_RAW_SHAPE, TAG_TASK, TAG_THRESHOLD, predict_logits
    from hpolab.stores.mlflow_runs import client_for

    client = client_for(stores)
    mlflow.set_tracking_uri(stores.tracking_uri)
    tags, what = _model_tags(client, model_uri, stores)
    if TAG_RAW_SHAPE not in tags or TAG_RAW_DTYPE not in tags:
        raise UserError(f"{model_uri} ({what}) was not promoted by hpolab promote: it lacks the tags {TAG_RAW_SHAPE} / {TAG_RAW_DTYPE} that say what raw input it takes")
    raw_shape = tuple(json.loads(tags[TAG_RAW_SHAPE]))
    raw_dtype = np.dtype(tags[TAG_RAW_DTYPE])
    class_names = json.loads(tags.get(TAG_CLASS_NAMES, "[]"))

    if not isinstance(inputs, Path):
        x = _check_shape(np.asarray(inputs), raw_shape, raw_dtype, "inputs")
        names = [str(i) for i in range(len(x))]
    elif inputs.is_dir():
        x, names = _load_images(inputs, raw_shape, raw_dtype)
    elif inputs.is_file() and inputs.suffix.lower() == ".npy":
        x = _load_npy(inputs, raw_shape, raw_dtype)
        names = [str(i) for i in range(len(x))]
    else:
        raise UserError(f"{inputs}: expected a .npy file of raw inputs or a folder of images")

    model = mlflow.pytorch.load_model(model_uri, map_location="cpu")
    served = predict_logits(model, x)
    task = tags.get(TAG_TASK, "classification")
    threshold = float(tags.get(TAG_THRESHOLD, "0.5"))
    return Predictions(predictions_table(task, served, names, class_names, threshold), served, task, threshold, what)


def predictions_table(task: str, served, names: list[str], class_names: list[str], threshold: float):
    """The champion's pyfunc output (hpolab_pyfunc.output_frame: the same code, the same columns) with the
    input's index or file name first; custom: the served outputs as columns output_<c>."""
    import pandas as pd

    from hpolab.registry.hpolab_pyfunc import output_frame, suffixes

    table = output_frame(task, served, class_names, threshold)
    if not isinstance(table, pd.DataFrame):  # custom: the raw outputs
        values = table.reshape(len(table), -1)
        table = pd.DataFrame({f"output_{c}": values[:, j] for j, c in enumerate(suffixes(values.shape[1], class_names))})
    table.insert(0, "input", names)
    return table


def _npy_array(task: str, served) -> np.ndarray:
    """--out FILE.npy: class indices (int64) for classification; else the served values (regression: the
    target's units, (N, k); multilabel: probabilities (N, k); custom: the outputs)."""
    if task == "classification":
        return served.argmax(dim=1).numpy().astype(np.int64)
    values = served.numpy()
    return values if task == "custom" else values.reshape(len(values), -1)


def _write(out: Path | None, array: np.ndarray, table) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    if out is not None and out.suffix.lower() == ".npy":
        np.save(out, array)
    elif out is not None:
        table.to_csv(out, index=False)
    else:
        table.to_csv(sys.stdout, sep="\t", index=False, lineterminator="\n")
    if out is not None:
        print(f"wrote {out}", file=sys.stderr)


def _model_tags(client, uri: str, stores: Stores) -> tuple[dict[str, str], str]:
    """Tags of the registered version (or of the logged model) behind `uri`, and a description."""
    from mlflow.exceptions import MlflowException

    from hpolab.errors import UserError

    m = re.fullmatch(r"models:/([^/@]+)(?:@([^/]+)|/(\d+))?", uri)
    if not m:
        raise UserError(f"{uri}: expected models:/NAME@ALIAS, models:/NAME/VERSION or models:/m-<id>")
    name, alias, version = m.groups()
    try:
        if alias:
            mv = client.get_model_version_by_alias(name, alias)
        elif version:
            mv = client.get_model_version(name, version)
        else:  # a logged model id
            lm = client.get_logged_model(name)
            return dict(lm.tags), f"logged model {name}"
    except MlflowException as e:  # (not found: in the store that was looked in, named with how to name another)
        raise UserError(f"{uri}: {e.message} in the MLflow store {stores.tracking_shown}; is --store / --tracking-uri "
                        "the study's?") from e
    tags = dict(mv.tags)
    # The logged model carries the serving tags too (the SQLite registry keeps its id in `source` only).
    model_id = getattr(mv, "model_id", None) or (mv.source.removeprefix("models:/") if (mv.source or "").startswith("models:/m-") else None)
    if model_id:
        try:
            tags = {**client.get_logged_model(model_id).tags, **tags}
        except MlflowException:
            pass
    return tags, f"{name} version {mv.version}"


def _load_npy(path: Path, raw_shape: tuple[int, ...], raw_dtype: np.dtype) -> np.ndarray:
    from hpolab.errors import UserError

    try:
        x = np.load(path, allow_pickle=False)
    except Exception as e:
        raise UserError(f"{path}: not a readable .npy array ({e})") from e
    return _check_shape(x, raw_shape, raw_dtype, str(path))


def _check_shape(x: np.ndarray, raw_shape: tuple[int, ...], raw_dtype: np.dtype, what: str) -> np.ndarray:
    """(N, *raw_shape) inputs cast to the raw dtype; one sample (*raw_shape) becomes N = 1."""
    from hpolab.errors import UserError

    if tuple(x.shape) == raw_shape:
        x = x[None]
    if tuple(x.shape[1:]) != raw_shape:
        raise UserError(f"{what}: shape {tuple(x.shape)}; this model takes raw inputs of shape (N, {', '.join(map(str, raw_shape))}) or one {raw_shape}")
    return _cast(x, raw_dtype, what)


def _cast(x: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    from hpolab.errors import UserError

    if x.dtype == dtype:
        return np.ascontiguousarray(x)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        finite = np.isfinite(x).all() if np.issubdtype(x.dtype, np.floating) else True
        if not finite or (x.size and (x.min() < info.min or x.max() > info.max)) or not np.array_equal(np.round(x), x):
            lo, hi = (float(x.min()), float(x.max())) if x.size else (0, 0)
            raise UserError(
                f"{what}: this model takes raw {dtype} values {info.min}..{info.max} (as the experiment's data has them, "
                f"before preprocessing); got {x.dtype} values in [{lo:g}, {hi:g}]"
            )
    return np.ascontiguousarray(x.astype(dtype))


def _load_images(folder: Path, raw_shape: tuple[int, ...], raw_dtype: np.dtype) -> tuple[np.ndarray, list[str]]:
    from PIL import Image

    from hpolab.errors import UserError

    if raw_dtype != np.uint8 or not (len(raw_shape) == 2 or (len(raw_shape) == 3 and raw_shape[0] in (1, 3))):
        raise UserError(
            f"this model takes raw {raw_dtype} arrays of shape {raw_shape}, not uint8 images: pass a .npy of raw inputs"
        )
    h, w = raw_shape[-2:]
    channels = 1 if len(raw_shape) == 2 else raw_shape[0]
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise UserError(f"{folder}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
    arrays = []
    for p in files:
        try:
            with Image.open(p) as im:
                im = im.convert("L" if channels == 1 else "RGB")
                if im.size != (w, h):
                    im = im.resize((w, h), Image.Resampling.BILINEAR)
                a = np.asarray(im, dtype=np.uint8)
        except Exception as e:
            raise UserError(f"{p}: cannot read the image ({e})") from e
        if len(raw_shape) == 3:
            a = a[None] if channels == 1 else a.transpose(2, 0, 1)
        arrays.append(a)
    return np.stack(arrays), [p.name for p in files]
