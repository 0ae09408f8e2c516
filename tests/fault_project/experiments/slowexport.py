"""The fault project's MLP whose model export is slow in one trial (for the upload-thread tests).

When HPOLAB_TEST_SLOW_EXPORT_DIR is set, the first trial process whose model runs while it is saved
(study/trials/child_export.py: save_model_folder, after the trial's last epoch) claims the file `slow`
there, writes its trial folder into it, sleeps HPOLAB_TEST_SLOW_EXPORT_S seconds (default 20), then
writes `slow.done` with the time it woke (time.time()). Every other forward pass, training included,
is the plain MLP's.
"""

from __future__ import annotations

import os
import sys
import time

from torch import nn

from experiments.faulty import MODEL_DEFAULTS, load_data  # noqa: F401 -- the same data and defaults
from experiments.faulty import build_model as _faulty_model

DATA_DEFAULTS: dict = {}


def _saving_for(frame) -> str | None:
    """The trial folder when this forward pass runs inside child_export.save_model_folder, else None."""
    while frame is not None:
        if frame.f_code.co_name == "save_model_folder":
            return str(frame.f_locals.get("trial_dir"))
        frame = frame.f_back
    return None


class SlowToSave(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        folder = os.environ.get("HPOLAB_TEST_SLOW_EXPORT_DIR")
        trial_dir = _saving_for(sys._getframe(1)) if folder else None
        if trial_dir is not None:
            try:
                fd = os.open(os.path.join(folder, "slow"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                fd = None  # another trial is the slow one (or this one slept already)
            if fd is not None:
                os.write(fd, trial_dir.encode())
                os.close(fd)
                time.sleep(float(os.environ.get("HPOLAB_TEST_SLOW_EXPORT_S", "20")))
                with open(os.path.join(folder, "slow.done"), "w") as f:
                    f.write(repr(time.time()))
        return self.inner(x)


def build_model(model: dict, input_shape, num_classes):
    return SlowToSave(_faulty_model(model, input_shape, num_classes))
