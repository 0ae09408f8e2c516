"""Imported only as a forkserver preload (trial_forkserver.py), when the spec logs models: warms the model
export once so that every trial forked afterwards saves its model warm (child_export.py).

A failure here is only a missed warm-up: the trial's own save reports any real problem.

MLflow's telemetry is off in the forkserver and so in the trials: its client starts threads, and a
fork copies only the thread that forks (a lock one of them held would stay held in every trial).
Trial processes never talk to the tracking store; the driver's telemetry is the user's setting.

mlflow.pytorch is imported here without its Lightning autologging callback (`_lightning_autolog`):
mlflow.pytorch imports that callback, and with it all of pytorch_lightning, whenever the package is
installed (3-4 s of CPU, measured on the 2-core machine with torch imported), and every study that logs
models waited for it before its first trial. A trial never autologs (it does not talk to the tracking
store): all its process lacks is the attribute `mlflow.pytorch.MlflowModelCheckpointCallback`; an
explicit import of `mlflow.pytorch._lightning_autolog` still works.
"""

import os
import sys

os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"

# MLflow may be imported already (the command imports it before forking this server: trial_forkserver.start),
# with the client its import set up from the user's setting: set it up again, now disabled.
from mlflow.telemetry import set_telemetry_client  # noqa: E402

set_telemetry_client()

from hpolab.study.trials import child_export  # noqa: E402  (after the setting above)

LIGHTNING_CALLBACK = "mlflow.pytorch._lightning_autolog"


def _import_mlflow_pytorch() -> None:
    sys.modules[LIGHTNING_CALLBACK] = None  # its `from ... import` raises ImportError, which mlflow.pytorch skips
    try:
        import mlflow.pytorch  # noqa: F401
    finally:
        del sys.modules[LIGHTNING_CALLBACK]


try:
    _import_mlflow_pytorch()
    child_export.warm()
except Exception:
    pass
