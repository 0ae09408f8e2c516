"""The trial of `hpolab reproduce`: the trial process's own trial object (study/trials/trial.py), run
in this process by run_trial as a trial process runs it (the experiment's `train(config, trial)`,
seeded as the trial was), with a Replay as the driver's end of its pipe.

The Replay records every report (per epoch, its numbers) instead of logging it, and answers "stop" to
the epoch its stretch ends at, "continue" before it: a pruned trial is compared on its epochs, as its
driver stopped it there. A PBT member's replay (reproduce_pbt.py) trains stretch after stretch: each
next one is a new attempt of the trial that resumes from the last checkpoint in the reproduction's
folder (the routine's last.pt, an own loop's trial.checkpoint), its config's new values in
`trial.config_changes` for the loop to give its optimizer, as the member's resumed attempts had them.
Nothing reaches the stores: the loop's log_params and log_model stay in this process.
"""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

# Reported per epoch by loops that time themselves; they measure the machine, never reproduce.
TIMING = ("epoch_seconds", "samples_per_second", "data_wait_fraction")


class Replay:
    """The driver's end of a reproduction's trial (see the module docstring); `history`: one dict per
    report, its epoch (as recorded) and its numeric metrics."""

    def __init__(self, experiment: ModuleType, number: int, params: dict[str, Any], folder: Path):
        self.experiment, self.number, self.params, self.dir = experiment, number, params, folder
        self.history: list[dict[str, float]] = []

    def stretch(self, config: dict, last: int) -> None:
        """Train with `config` up to epoch `last`: from the last checkpoint when epochs were trained already."""
        from hpolab.study.trials.trial import run_trial

        checkpoint = self.dir / "last.pt"
        job = {"config": config, "number": self.number, "params": self.params, "checkpoint_dir": str(self.dir),
               "resume_from": str(checkpoint) if self.history and checkpoint.is_file() else None,
               "export_model": False, "pipelined_reports": False}
        ours, theirs = multiprocessing.Pipe()
        answering = threading.Thread(target=self._answer, args=(ours, last), name="reproduce-driver", daemon=True)
        answering.start()
        run_trial(theirs, job, report=_outcome, offer_export=None, experiment=self.experiment)  # (it closes `theirs`)
        answering.join()

    def _answer(self, conn, last: int) -> None:
        """As a driver: "go", then an answer to every epoch, until the trial's end of the pipe closes."""
        conn.send("go")
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            if msg[0] == "epoch":  # (("params", ...): the loop's log_params, nothing to answer)
                epoch, metrics = int(msg[1]), msg[2]
                self.history.append({"epoch": epoch, **{k: float(v) for k, v in metrics.items()}})
                conn.send("stop" if epoch >= last else "continue")


def _outcome(conn, work, close: bool = True) -> dict[str, Any] | None:
    """run_trial's `report`: the trial's work, its outcome kept here (the reports are what is compared).
    A trial that ended in a TrialFailure (a summary the original could not have had either) still has
    its reports."""
    from hpolab.study.trials.trial import TrialFailure

    try:
        return work()
    except TrialFailure:
        return None


def sampled_params(run, stores) -> dict[str, Any]:
    """trial.params as the trial had them: its Optuna trial's params ({} when the study is not reachable)."""
    from hpolab.stores.optuna_storage import load_study

    tags = run.data.tags
    try:
        study = load_study(tags["optuna.study"], stores)
        return dict(study.trials[int(tags["optuna.trial_number"])].params)
    except Exception:  # noqa: BLE001 -- a reproduction without the Optuna store: config still has every value
        return {}
