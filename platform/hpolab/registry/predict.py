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

Output: one line per input, by the model's task (tag hpolab.task): classification: index or file name,
class index, class name, probability (.npy: class indices, int64); regression: the predicted values in
the target's units; multilabel: each label's probability and the predicted labels; custom: the served
outputs. --out FILE.csv (same columns) / FILE.npy (the array).
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import numpy as np

from hpolab.stores.paths import Stores

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm"}


def predict_cmd(args, stores: Stores) -> int:
    import mlflow
    import mlflow.pytorch

    from hpolab.errors import UserError
    from hpolab.registry.serving import TAG_CLASS_NAMES, TAG_RAW_DTYPE, TAG_RAW_SHAPE, TAG_TASK, TAG_THRESHOLD, predict_logits
    from hpolab.stores.mlflow_runs import client_for

    out = Path(args.out) if args.out else None
    if out is not None and out.suffix.lower() not in (".csv", ".npy"):
        raise UserError(f"--out {out}: use a .csv or .npy file name")
    client = client_for(stores)
    mlflow.set_tracking_uri(stores.tracking_uri)
    tags, what = _model_tags(client, args.model_uri)
    if TAG_RAW_SHAPE not in tags or TAG_RAW_DTYPE not in tags:
        raise UserError(f"{args.model_uri} ({what}) was not promoted by hpolab promote: it lacks the tags {TAG_RAW_SHAPE} / {TAG_RAW_DTYPE} that say what raw input it takes")
    raw_shape = tuple(json.loads(tags[TAG_RAW_SHAPE]))
    raw_dtype = np.dtype(tags[TAG_RAW_DTYPE])
    class_names = json.loads(tags.get(TAG_CLASS_NAMES, "[]"))

    source = Path(args.input)
    if source.is_dir():
        x, names = _load_images(source, raw_shape, raw_dtype)
    elif source.is_file() and source.suffix.lower() == ".npy":
        x = _load_npy(source, raw_shape, raw_dtype)
        names = [str(i) for i in range(len(x))]
    else:
        raise UserError(f"{source}: expected a .npy file of raw inputs or a folder of images")

    model = mlflow.pytorch.load_model(args.model_uri, map_location="cpu")
    served = predict_logits(model, x)
    task = tags.get(TAG_TASK, "classification")
    array, header, rows = _task_rows(task, served, names, class_names, float(tags.get(TAG_THRESHOLD, "0.5")))
    print(f"{len(x)} predictions ({task}) from {what}", file=sys.stderr)
    _write(out, array, header, rows)
    return 0


def _task_rows(task: str, served, names: list[str], class_names: list[str], threshold: float):
    """(the .npy array, CSV header, CSV rows) of the task's predictions.

    classification: class index, name, probability (.npy: class indices, int64); regression: the values in
    the target's units (.npy: float32 (N, k)); multilabel: each label's probability and the labels at or
    above the threshold (.npy: probabilities (N, k)); custom: the served outputs (.npy: them)."""
    import torch

    if task == "classification":
        conf, pred = torch.softmax(served, dim=1).max(dim=1)
        pred_np = pred.numpy().astype(np.int64)
        labels = [class_names[i] if i < len(class_names) else str(i) for i in pred_np]
        rows = [(n, int(p), lab, f"{float(c):.4f}") for n, p, lab, c in zip(names, pred_np, labels, conf)]
        return pred_np, ["input", "class", "label", "probability"], rows
    values = served.reshape(len(served), -1).numpy()
    cols = [class_names[j] if j < len(class_names) else f"output_{j}" for j in range(values.shape[1])]
    if task == "regression" and values.shape[1] == 1:
        cols = ["prediction"]
    header = ["input", *cols]
    if task == "multilabel":
        header.append(f"labels (p >= {threshold:g})")
        rows = [(n, *(f"{v:.4f}" for v in row), "|".join(c for c, v in zip(cols, row) if v >= threshold)) for n, row in zip(names, values)]
    else:
        rows = [(n, *(f"{v:.6g}" for v in row)) for n, row in zip(names, values)]
    return values, header, rows


def _write(out: Path | None, array: np.ndarray, header: list[str], rows: list[tuple]) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    if out is not None and out.suffix.lower() == ".npy":
        np.save(out, array)
    elif out is not None:
        with open(out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)
    else:
        w = csv.writer(sys.stdout, delimiter="\t", lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    if out is not None:
        print(f"wrote {out}", file=sys.stderr)


def _model_tags(client, uri: str) -> tuple[dict[str, str], str]:
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
    except MlflowException as e:
        raise UserError(f"{uri}: {e.message}") from e
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
    if tuple(x.shape) == raw_shape:
        x = x[None]
    if tuple(x.shape[1:]) != raw_shape:
        raise UserError(f"{path}: shape {tuple(x.shape)}; this model takes raw inputs of shape (N, {', '.join(map(str, raw_shape))}) or one {raw_shape}")
    return _cast(x, raw_dtype, str(path))


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
