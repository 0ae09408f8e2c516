"""Running a study: `hpolab.run_study(...)` and `hpolab study run` / `hpolab worker` are this code.

`drive` is the one code path: check the spec (a file or a dict), start the trials' forkserver, run
the driver, return its Outcome. The CLI maps the Outcome to an exit code and a line (`study_exit`);
`run_study` maps the same Outcome to a Study, a StudyError, or KeyboardInterrupt.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import hpolab.api.specs as specs
from hpolab.api.stores import keep_tracking_uri, open_stores
from hpolab.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, StudyError

if TYPE_CHECKING:  # the annotation only (run_study imports Study when it returns one)
    from hpolab.api.study import Study


@dataclass(frozen=True)
class Run:
    """What one run of the driver did: the checked spec and the driver's Outcome."""

    spec: Any  # hpolab.config.spec.StudySpec
    outcome: Any  # hpolab.study.driver.driver.Outcome


def drive(spec: specs.SpecSource, overrides: list[str], stores, progress: Callable[[Any], Any], *, worker: bool = False,
          allow_spec_change: bool = False, allow_code_change: bool = False, project_dir: str | Path | None = None,
          command: bool = False) -> Run:
    """Check the spec, run the driver until the budget, a timeout, a stop or a signal; the Outcome.

    `progress(spec)` makes the driver's Progress. `worker`: join a study other drivers run now (the
    sampler seed is salted). `command`: this is the `hpolab` command's own process (it may fork its
    forkserver, and stops an early one completely before exiting on a bad spec)."""
    from hpolab.study.trials import trial_forkserver

    # A forkserver that cannot be a fork of this process (a notebook's, a script's: they may hold any
    # threads) imports torch and the experiment itself (seconds) while the spec is checked, MLflow
    # imported and the stores opened; a bad spec stops it at once.
    early = specs.is_spec_file(spec) and trial_forkserver.start_early(str(spec), overrides)
    try:
        checked = specs.load(spec, overrides, project_dir)
    except BaseException:
        if early:
            (trial_forkserver.stop_before_exit if command else trial_forkserver.stop_now)()
        raise
    from hpolab.study.driver.run import run_checked
    from hpolab.study.sampling.seeds import worker_salt

    # `hpolab worker` joins a study that other drivers are running now: salt the sampler seed (host,
    # pid, start time, random bits: containers all run as PID 1) so workers do not propose identical trials.
    worker_seed = worker_salt() if worker else 0
    outcome = run_checked(checked, stores, progress(checked), worker_seed=worker_seed, allow_spec_change=allow_spec_change,
                          allow_code_change=allow_code_change, command=command)
    return Run(checked, outcome)


def study_exit(outcome, stores=None) -> tuple[int, str | None]:
    """The exit code of `study run` and the one line saying why it is not 0 (`stores`: named in its hint)."""
    c = outcome.counts
    if outcome.signal is not None:
        name = "SIGTERM" if outcome.signal == signal.SIGTERM else "Ctrl-C"
        return (EXIT_TERMINATED if outcome.signal == signal.SIGTERM else EXIT_INTERRUPTED,
                f"interrupted by {name} with {c.get('finished', 0)}/{outcome.n_trials} trials finished; "
                "re-run the same command to resume")
    if outcome.halted:
        return EXIT_OK, None  # `hpolab study stop`: every worker ends on purpose (the driver said so)
    if outcome.failure_limit:
        from hpolab.study.state.budget import CONTRACT_BROKEN

        if CONTRACT_BROKEN in outcome.failure_limit:  # one trial is enough: fix train() and run the same command again
            return EXIT_FAILED, f"stopped: {outcome.failure_limit}"
        return EXIT_FAILED, f"stopped after the failure limit: {outcome.failure_limit}"
    if outcome.budget_spent:
        return EXIT_OK, None  # budget.epochs used up: planned (the summary says so, and what it reached)
    if not c.get("complete"):
        return EXIT_FAILED, (f"no trial completed ({c.get('fail', 0)} failed, {c.get('pruned', 0)} pruned of "
                             f"{c.get('finished', 0)} finished); see the fail reasons above or in "
                             f"`{stores.command('study status') if stores is not None else 'hpolab study status'}`")
    if c.get("finished", 0) >= outcome.n_trials or outcome.timed_out or outcome.stopped:
        return EXIT_OK, None  # (stopped: stop_after_no_improvement ended the study on purpose)
    return EXIT_FAILED, f"the study stopped with {c.get('finished', 0)}/{outcome.n_trials} trials finished"


def raise_for_outcome(outcome, stores=None) -> None:
    """run_study's end: nothing when `study run` would exit 0; KeyboardInterrupt after Ctrl-C or
    SIGTERM (the stores are consistent, the signal handlers restored: run_study again continues);
    StudyError with `study run`'s line otherwise."""
    code, message = study_exit(outcome, stores)
    if code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        raise KeyboardInterrupt(message)
    if code != EXIT_OK:
        raise StudyError(message)


def run_study(spec: specs.SpecSource, overrides: specs.Overrides = None, *, store: str | Path | None = None,
              storage: str | None = None, tracking_uri: str | None = None, progress: bool = True,
              new_study: str | None = None, allow_spec_change: bool = False, allow_code_change: bool = False,
              project_dir: str | Path | None = None, trial_output: bool = True) -> "Study":
    """Run (or continue) a study up to its `n_trials` budget, as `hpolab study run SPEC key=value ...`.

    `spec`: a spec file's path, or a dict of the same keys (checked the same way: a SpecError names
    the field). `overrides`: "key=value" strings as on the command line, or a dict of dotted keys to
    values (`{"n_trials": 4, "trainer.max_epochs": 2}`). `store` / `storage` / `tracking_uri`: the
    CLI's --store / --storage / --tracking-uri (default: the environment, then ./mlruns).
    `progress`: print the trial lines and the summary table (a bar of finished trials too in
    Jupyter); `trial_output`: with them, what the trials print (`trial N | ...`; False: only in each
    trial's output.log, the CLI's --hide-trial-output). `new_study`, `allow_spec_change`, `allow_code_change`: the CLI's options of the same
    names. `project_dir`: where a dict spec's experiment is found (default: the working directory).

    Returns the Study when `study run` would exit 0. Raises SpecError / UserError for bad input,
    StudyError when the study cannot go on or ends as `study run` exits 1 (no trial completed, the
    failure limit, budget not reached), and KeyboardInterrupt after Ctrl-C or SIGTERM once the
    stores are consistent: running trials were checkpointed and queued, the previous signal handlers
    are back, and calling run_study again continues the study.
    """
    from hpolab.api.study import Study

    items = specs.override_strings(overrides, new_study)
    with keep_tracking_uri():
        stores = open_stores(store, storage, tracking_uri)
        run = drive(spec, items, stores, _progress_maker(progress, trial_output), allow_spec_change=allow_spec_change,
                    allow_code_change=allow_code_change, project_dir=project_dir)
    raise_for_outcome(run.outcome, stores)
    return Study(run.spec.name, stores, spec=run.spec, outcome=run.outcome)


def _progress_maker(show: bool, trial_output: bool = True) -> Callable[[Any], Any]:
    import time

    from hpolab.study.driver.progress import Progress

    started = time.monotonic()  # (elapsed: this call's time)
    return lambda spec: Progress(spec, quiet=not show, trial_output=trial_output, started=started)
