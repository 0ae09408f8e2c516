"""A stop that reaches a loop between its reports: the driver's "stop" interrupts the epoch in progress.

With no pruner a report does not wait for the driver's answer (reports.py): the loop trains its next
epoch while the answer comes. The routine asks `trial.stop_requested()` between batches; any other
loop would learn of a stop only at its next report, after training that whole epoch for nothing (the
records end at the epoch the driver answered "stop" to either way). So when the answer is "stop", the
report's thread signals the process's main thread (STOP_SIGNAL), and the handler raises StopTraining
there, in the loop's own code, between two Python statements or when a call into C returns (a batch's
forward or backward pass, a sleep). `train()` then ends as a loop that returned after the stop would:
its `finally:` blocks run, and the trial ends after its last reported epoch.

The handler raises only in the loop's own code: the main thread's stack runs through `run` (the call
of `train`), and not through the trial object (its report, checkpoint, log_model ...: those finish and
report returns True as before), nor is the stop seen after `train` returned. A loop that catches
BaseException goes on to its next report, which returns True. STOP_SIGNAL is a real-time signal,
which the libraries a loop uses leave alone (SIGUSR1 is Lightning's SLURM requeue); it is sent only
to a process whose main thread installed this handler.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable

STOP_SIGNAL = signal.SIGRTMIN + 4


class StopTraining(BaseException):
    """The driver answered "stop": raised in the loop's code (a BaseException, as KeyboardInterrupt is,
    so that `except Exception:` in a loop lets it through)."""


def run(train: Callable[[dict, Any], Any], config: dict, trial: Any) -> None:
    """train(config, trial), ended early by a stop (StopTraining) as by a loop that returned."""
    try:
        train(config, trial)
    except StopTraining:
        pass


def interrupter() -> Callable[[], None] | None:
    """Install the handler (main thread only) and return what the report's thread calls on "stop";
    None where no handler can be installed (the loop then learns of the stop at its next report)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    main = threading.main_thread().ident

    def handler(signum, frame) -> None:
        if _in_the_loop(frame):
            raise StopTraining()

    signal.signal(STOP_SIGNAL, handler)
    return lambda: signal.pthread_kill(main, STOP_SIGNAL)


def _in_the_loop(frame) -> bool:
    """Whether `frame` is the loop's code: below run's call of train, and not in the trial object (a
    module of this package: the trial, its reports, its config changes, its contract checks)."""
    f = frame
    while f is not None:
        if f.f_code is run.__code__:
            return f is not frame  # (run itself: train has returned, or not started)
        if f.f_globals.get("__name__", "").startswith(_OURS):
            return False
        f = f.f_back
    return False


_OURS = __name__.rpartition(".")[0] + "."  # hpolab.study.trials.
