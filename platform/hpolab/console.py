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
    user needs. Everything a normal exit does that matters is done here first, in its order: shut
    down thread pools and join the threads that are not daemons (joining them alone hangs on an idle
    pool), run the atexit handlers (MLflow's and logging's flushes, multiprocessing's clean-up),
    flush stdout and stderr."""
    from hpolab.cli import main

    code = main()
    threading._shutdown()  # what the interpreter does first: stops thread pools, joins non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that left (`| head`), a closed stream
            pass
    os._exit(code if isinstance(code, int) else 0)
