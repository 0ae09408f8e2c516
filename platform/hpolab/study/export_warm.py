"""Imported only as a forkserver preload (runner.py), when the spec logs models: warms the model
export once so that every trial forked afterwards saves its model warm (child_export.py).

A failure here is only a missed warm-up: the trial's own save reports any real problem.
"""

from hpolab.study import child_export

try:
    child_export.warm()
except Exception:
    pass
