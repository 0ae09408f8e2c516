"""`hpolab.lr_find(...)` and `hpolab.predict(...)`: `hpolab lr-find` and `hpolab predict` from Python.

The same functions as the commands (tools/lr_find.py, registry/predict.py); what the commands
print to a terminal is returned here as values: the LR range test's result and files, a DataFrame
of predictions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hpolab.api.specs as specs
from hpolab.api.stores import keep_tracking_uri, open_stores


@dataclass(frozen=True)
class LRFind:
    """An LR range test's outcome (`hpolab lr-find`)."""

    suggestion: float | None  # the suggested peak LR; None when the curve says nothing (see result.warning)
    result: Any  # hpolab.train.lr_suggest.LRRangeResult: the sweep's LRs and losses, the rule's other picks
    plot: Path  # the loss-vs-LR plot (PNG)
    csv: Path  # the sweep, one row per step
    run_id: str  # its MLflow run, in the study's experiment


def lr_find(spec: specs.SpecSource, overrides: specs.Overrides = None, *, out: str | Path | None = None,
            store: str | Path | None = None, storage: str | None = None, tracking_uri: str | None = None,
            project_dir: str | Path | None = None) -> LRFind:
    """The LR range test (Leslie Smith) on the spec's experiment, run in this process and logged to
    the study's MLflow experiment, as `hpolab lr-find SPEC key=value ... [--out DIR]`.

    `spec` / `overrides` / `project_dir`: as for run_study. `out`: where the plot and CSV go (default
    STORE/lr-find/NAME). Prints what the command prints. Raises SpecError / UserError for bad input."""
    from hpolab.tools.lr_find import lr_find_and_print

    with keep_tracking_uri():
        stores = open_stores(store, storage, tracking_uri)
        checked = specs.load(spec, specs.override_strings(overrides), project_dir)
        result, paths, run_id = lr_find_and_print(checked, stores, Path(out) if out is not None else None)
    return LRFind(result.suggestion, result, paths["plot"], paths["csv"], run_id)


class ModelUri(str):
    """A model URI (models:/NAME@ALIAS, models:/m-<id>) that remembers the stores it is in: what
    Promotion.model_uri and Study.best.model_uri return, so that hpolab.predict(uri, x) reads the
    store the study ran in, not ./mlruns. A plain str everywhere else."""

    stores: Any

    def __new__(cls, uri: str, stores) -> "ModelUri":
        made = super().__new__(cls, uri)
        made.stores = stores
        return made


def predict(model_uri: str, inputs: Any, *, store: str | Path | None = None, tracking_uri: str | None = None):
    """Predictions of a model promoted by `hpolab promote` (models:/NAME@ALIAS, models:/NAME/VERSION or
    models:/m-<id>), as `hpolab predict MODEL_URI INPUT` prints them: a pandas DataFrame with `input`
    (the row's index, or the image's file name) and the columns of the model's task
    (classification: class, label, prob_<class>...; regression: prediction; multilabel: label_<l>,
    prob_<l>...; custom: output_<j>).

    `inputs`: raw inputs as the experiment's data holds them (before preprocessing) -- a numpy array
    or a torch tensor of shape (N, *raw_shape) or one sample (*raw_shape) -- or the path of a .npy
    file or a folder of images. `store` / `tracking_uri`: where the model is registered (default: the
    stores of a Promotion's or Study's model_uri, else the environment, then ./mlruns). Raises UserError
    when the URI, the model or the inputs do not fit, or the store does not exist."""
    from hpolab.registry.predict import predictions

    if isinstance(inputs, str):
        inputs = Path(inputs)
    elif hasattr(inputs, "detach"):  # a torch tensor (on any device, with or without grad)
        inputs = inputs.detach().cpu().numpy()
    if store is None and tracking_uri is None and isinstance(model_uri, ModelUri):  # a Promotion's / Study's: its stores
        store, tracking_uri = model_uri.stores.root, model_uri.stores.tracking_uri
    with keep_tracking_uri():
        stores = open_stores(store, None, tracking_uri, optuna=False, create=False)
        return predictions(str(model_uri), inputs, stores).table
