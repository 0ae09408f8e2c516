"""Running a checked spec: its trial runner, the Driver, and the caller's main module hidden while
trials start. `hpolab study run`, `hpolab worker` and run_study (api/running.py `drive`, which checks
the spec first) and the rounds of a promotion race (registry/race.py) are this code.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from hpolab.stores.paths import Stores
from hpolab.study.driver.driver import Driver
from hpolab.study.driver.outcome import Outcome
from hpolab.study.driver.progress import Progress


def run_checked(checked, stores: Stores, progress: Progress, *, worker_seed: int = 0, allow_spec_change: bool = False,
                allow_code_change: bool = False, command: bool = False) -> Outcome:
    """Run the driver on a checked StudySpec until its budget, a timeout, a stop or a signal.

    `worker_seed`: the salt of a worker joining a study others run now (study/sampling/seeds.py).
    `command`: this is the `hpolab` command's own process (its main module is hpolab's)."""
    from hpolab.study.trials.runner import started_runner

    runner = started_runner(checked)  # (the one started early, unless the checked spec differs)
    # The spec's project (the folder holding its experiments/): trial processes import the
    # experiment from there, whatever the working directory.
    driver = Driver(checked, stores, progress, project_dir=checked.project_dir, worker_seed=worker_seed,
                    allow_spec_change=allow_spec_change, allow_code_change=allow_code_change, runner=runner)
    with contextlib.nullcontext() if command else main_module_hidden():
        return driver.run()


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """While trials start, multiprocessing does not see the caller's main module (a script's file).

    It tells each new process to import the parent's `__main__` first (spawn.get_preparation_data:
    the forkserver's children too): a script calling run_study at its top level, without
    `if __name__ == "__main__":`, would run again in every trial process and start a study there. A
    trial runs hpolab's own code only; it never needs the caller's main module."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    for k in saved:
        setattr(main, k, None) if k == "__spec__" else delattr(main, k)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)
