"""Imported only as a forkserver preload (trial_forkserver.py), when the spec logs models: warms the model
export once so that every trial forked afterwards saves its model warm (child_export.py).

A failure here is only a missed warm-up: the trial's own save reports any real problem.

MLflow's telemetry is off in the forkserver and so in the trials: its client starts threads, and a
fork copies only the thread that forks (a lock one of them held would stay held in every trial).
Trial processes never talk to the tracking store; the driver's telemetry is the user's setting.
"""

import os

os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"

# MLflow may be imported already (the command imports it before forking this server: trial_forkserver.start),
# with the client its import set up from the user's setting: set it up again, now disabled.
from mlflow.telemetry import set_telemetry_client  # noqa: E402

set_telemetry_client()

from hpolab.study.trials import child_export  # noqa: E402  (after the setting above)

try:
    child_export.warm()
except Exception:
    pass
