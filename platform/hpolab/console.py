"""The `hpolab` console script (pyproject's [project.scripts]): the CLI, then a quick exit."""

from __future__ import annotations

import atexit
import os
import sys
import threading


def run() -> None:
    """The `hpolab` console script: main(), then an exit that skips tearing down the interpreter.

    Freeing a heap that holds torch, MLflow and scikit-learn takes seconds of CPU (about 2 s after a
    study on a 2-core machine, measured with strace: no system calls, only frees) and does nothing a
    user needs. Everything a normal exit does that matters is done here first (finish: MLflow's and
    logging's flushes, multiprocessing's clean-up among the atexit handlers)."""
    from hpolab.cli import main

    code = main()
    finish()
    os._exit(code if isinstance(code, int) else 0)


def finish() -> None:
    """What an interpreter's exit does before it tears itself down, in its order: shut down thread
    pools and join the threads that are not daemons (threading._shutdown: joining them alone hangs on
    an idle pool), run the atexit handlers, flush stdout and stderr."""
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that left (`| head`), a closed stream
            pass
