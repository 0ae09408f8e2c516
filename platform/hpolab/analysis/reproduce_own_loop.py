"""`hpolab reproduce RUN_ID` for a trial of an own-loop experiment (`train(config, trial)`).

The experiment's own train() runs again in this process (a fresh one: the command's, not the driver's
forkserver) with the run's config.yaml, seeded and threaded as the trial process did it
(seed_everything(seed, trainer.deterministic), hpolab.torch_threads), and a LocalTrial that records the
reports instead of sending them: every metric train() reports is compared with the run's history at
the same epoch (timing metrics excepted: they measure the machine, not the training). The trial stops
after the epochs the run logged (report returns True then, as for a pruned trial), so a pruned trial
is compared on its epochs. Nothing is written: checkpoint() keeps nothing, restore() is None (the
reproduction starts from scratch), log_model() is ignored.

A run whose attempt resumed from a checkpoint (a retry) trained its later epochs after a restart:
its RNG streams differ from a run from scratch, so said, as the numbers may differ.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

# Reported per epoch by loops that time themselves; they measure the machine, never reproduce.
TIMING = ("epoch_seconds", "samples_per_second", "data_wait_fraction")


class LocalTrial:
    """The own-loop trial object of a reproduction (the members train() may use; see the module docstring)."""

    def __init__(self, number: int, params: dict[str, Any], config: dict, folder: Path, epochs: int):
        import torch

        from hpolab.study.trials.own_loop_contract import EpochNumbers

        self.number, self.params, self.config, self.dir = number, params, config, folder
        self.device, self.start_epoch = torch.device("cpu"), 1
        self.history: list[dict[str, float]] = []  # one dict per report: epoch (as recorded) + the numeric metrics
        self.config_changes: dict[str, Any] = {}  # (a reproduction starts from scratch: nothing restored)
        self.weights_epoch: int | None = None
        self._epochs = EpochNumbers()  # the trial's own numbering: a loop counting from 0 is recorded from 1
        self._stop_after = epochs

    def report(self, epoch: Any, metrics: dict[str, float] | None = None, checkpoint: dict | None = None) -> bool:
        if metrics is None and isinstance(epoch, dict):  # trial.report(metrics): the next epoch
            epoch, metrics = None, epoch
        recorded = self._epochs.record(epoch, self.history[-1]["epoch"] if self.history else 0, 1)
        row: dict[str, float] = {"epoch": recorded}
        for k, v in metrics.items():
            try:
                row[str(k)] = float(v)
            except (TypeError, ValueError):
                continue  # not a number: the trial process would have refused it; nothing to compare
        self.history.append(row)
        return recorded >= self._stop_after  # stop where the original stopped

    @property
    def is_best(self) -> bool:
        return False  # (log_model is ignored: nothing to keep)

    def checkpoint(self, state: dict) -> None:
        pass  # nothing is written by a reproduction

    def restore(self) -> dict | None:
        return None

    def apply_config_changes(self, optimizer, schedulers=()) -> list[str]:
        return []

    def log_params(self, params: dict) -> None:
        pass

    def log_model(self, model, input_example, *, epoch: int | None = None) -> None:
        pass


def reproduce_own_loop(client, stores, run, config: dict, exp, console, threads: int):
    """(compared metric names, the run's history {metric: {epoch: value}}, the LocalTrial with the new
    reports); UserError when the run logged no epoch of its study metric."""
    import optuna

    from hpolab.errors import UserError
    from hpolab.train import seed_everything

    run_id, tags = run.info.run_id, run.data.tags
    metric = config["metric"]
    epochs = max((h.step for h in client.get_metric_history(run_id, metric)), default=0)
    if epochs == 0:
        raise UserError(f"run {run_id} logged no epoch of {metric}: nothing to compare")
    if tags.get("hpolab.resumed_after_epoch"):  # a retry that resumed from a checkpoint
        console.print(f"  [yellow]note[/]: this attempt resumed after epoch {tags['hpolab.resumed_after_epoch']}; the "
                      "reproduction trains from scratch (random streams after the resume differ, so may the numbers)")
    import torch

    torch.set_num_threads(threads)
    seed_everything(config["seed"], bool(config["trainer"].get("deterministic", False)))  # as the trial process did
    with tempfile.TemporaryDirectory(prefix="hpolab-reproduce-") as folder:
        trial = LocalTrial(int(tags.get("optuna.trial_number", "0")), _sampled(run, stores), config, Path(folder), epochs)
        try:
            exp.train(config, trial)
        except optuna.TrialPruned:
            pass
    reported = dict.fromkeys(k for row in trial.history for k in row if k != "epoch" and k not in TIMING)
    compared = tuple(m for m in reported if m in run.data.metrics)
    history = {m: {h.step: h.value for h in client.get_metric_history(run_id, m)} for m in compared}
    return compared, history, trial


def _sampled(run, stores) -> dict[str, Any]:
    """trial.params as the trial had them: its Optuna trial's params ({} when the study is not reachable)."""
    from hpolab.stores.optuna_storage import load_study

    tags = run.data.tags
    try:
        study = load_study(tags["optuna.study"], stores)
        return dict(study.trials[int(tags["optuna.trial_number"])].params)
    except Exception:  # noqa: BLE001 -- a reproduction without the Optuna store: config still has every value
        return {}
