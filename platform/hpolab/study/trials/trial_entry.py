"""The trial process's entry point, kept apart from trial_process so the driver never imports it.

The forkserver pickles a process's target by reference (module + name) and the driver must import
that module to name it. trial_process imports torch and torch._dynamo (seconds of CPU) for the
forkserver to preload; the driver needs neither to start a trial, so it names this function, and
the trial, forked from the warm forkserver, finds trial_process already imported.
"""

from __future__ import annotations

from typing import Any


def run(conn, lifeline, job: dict[str, Any] | None, output=None, standby: dict[str, Any] | None = None) -> None:
    """`job` None: a standby process (runner.py), which gets ready and waits for its trial's job."""
    if output is not None:  # first: whatever the trial prints goes to its log (trial_output.py)
        from hpolab.study.trials.trial_output import capture

        capture(output)
    from hpolab.study.trials import trial_process

    if job is None:
        job = trial_process.stand_by(conn, lifeline, standby or {})
    trial_process.run(conn, lifeline, job)
