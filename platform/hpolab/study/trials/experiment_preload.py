"""The forkserver's import of the study's experiment, named by HPOLAB_FORKSERVER_EXPERIMENT.

`study run` starts the forkserver before it checks the spec, so the experiment may be one that fails
to import. multiprocessing's own preload lets anything but ImportError escape as a traceback on the
user's terminal; here the failure is left to the driver's spec check, which says it in one line (and
a trial that imports the experiment again fails with its reason)."""

import importlib
import os

_name = os.environ.pop("HPOLAB_FORKSERVER_EXPERIMENT", None)  # popped: the trials forked from here do not see it
if _name:
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001 -- reported by the driver, see above
        pass
