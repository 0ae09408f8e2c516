"""The platform's routine as a `train(config, trial)`: the same contract an own training loop implements.

An experiment that defines data + model + task trains through the same trial object as an own loop
(study/trials/trial.py): each epoch is `trial.report(epoch, metrics, checkpoint=last.pt)` (True:
stop now), its checkpoints live in `trial.dir`, and a resumed attempt continues from
`trial.resume_path` (read once, by the trial object: `trial.resume_checkpoint`). What the routine does
that a user's loop may not is said by attributes of the function, which the trial process reads, not
by branches on which loop it runs:
- `resumes_exactly`: fit() restores every RNG stream, so a resumed run is bit-for-bit the uninterrupted one;
- `sets_up_before_go`: building data, model and optimizer writes nothing, so it happens while the
  driver records the segment's start (the trial waits for "go" at its first report or stop check);
- `polls_stop`: fit() asks `trial.stop_requested()` between batches, so its reports never wait for the
  driver's answer and a stop abandons the epoch in progress (on one device; on several, rank 0 waits
  for each answer so that every rank stops after the same epoch);
- `builds_model`: it builds the experiment's model and data itself, so a spec may ask several devices
  per trial, the LR range test, `doctor` and `lr-find` of it;
- `task()`: the experiment's task, which declares its metrics and their directions (ValueError: it has none);
- `takes_every_trainer_option`: fit() reads every trainer option, so its run records them all;
- `preload(data, data_seed)`: load the data before the trial is known (a standby trial process,
  study/trials/runner.py); the trial whose config asks for the same data and seed, with the same torch
  threads and deterministic mode, takes it instead of loading it. Kept only when load_data left the
  global RNGs as it found them (and did not start CUDA), and opened no relative path and left no file
  in the empty folder it ran in: then loading it earlier, elsewhere, cannot change what the trial
  trains on, its initial weights or anything else it draws;
- a trial whose `trial.ranks_of` is set (study/trials/ranks.py) trains as one of several ranks (DDP).
Its model is described as `model_from_checkpoint`: the driver can rebuild it from best.pt with the
experiment's build_model when this process could not save it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable


def builtin_train(experiment: ModuleType) -> Callable[[dict[str, Any], Any], Any]:
    """`train(config, trial)` for `experiment`: its load_data/build_model and task on fit()."""

    def train(config: dict[str, Any], trial: Any):
        from .config import trainer_config
        from .data import data_seed_of
        from .loop import fit
        from .tasks import task_for

        tcfg = trainer_config(config["trainer"])
        ranks_of = getattr(trial, "ranks_of", None)  # one of several ranks (study/trials/ranks.py): before the model
        ranks = ranks_of(tcfg) if ranks_of is not None else None
        data = _PRELOADED.pop(_data_key(experiment, config["data"], data_seed_of(config)), None) if _PRELOADED else None
        _PRELOADED.clear()  # (another config's: not this process's to keep)
        if data is None:
            data = experiment.load_data(config["data"], data_seed_of(config))  # the split: the study's data seed
        model = experiment.build_model(config["model"], data.input_shape, data.num_classes)
        trial.config_changes  # fit() gives a restored optimizer the config's values itself (state.restore)
        last = Path(trial.dir) / "last.pt"
        notes: list[str] = []
        result = fit(tcfg, model, data, metric=config["metric"], direction=config["direction"], seed=config["seed"],
                     checkpoint_dir=trial.dir, task=task_for(experiment), resume_from=trial.resume_path,
                     resume_checkpoint=trial.resume_checkpoint, log=notes.append,
                     on_epoch=lambda epoch, metrics: trial.report(epoch, metrics, checkpoint=last), ranks=ranks,
                     stop_requested=trial.stop_requested if ranks is None else None)  # (ranks: rank 0 answers at once)
        if ranks is None or ranks.is_rank0:
            _describe(trial, experiment, config, result, model, data, notes, devices=tcfg.devices)
        return result

    train.resumes_exactly = True  # type: ignore[attr-defined]
    train.builds_model = True  # type: ignore[attr-defined]
    train.takes_every_trainer_option = True  # type: ignore[attr-defined]
    train.task = lambda: _task(experiment)  # type: ignore[attr-defined]
    train.preload = lambda data, data_seed: _preload(experiment, data, data_seed)  # type: ignore[attr-defined]
    train.sets_up_before_go = True  # type: ignore[attr-defined]
    train.polls_stop = True  # type: ignore[attr-defined]
    return train


_PRELOADED: dict[str, Any] = {}  # this process's preloaded data by _data_key


def _data_key(experiment: ModuleType, data: Any, data_seed: int) -> str:
    """What load_data's result depends on: the experiment, its data config and seed, and torch's
    thread count and deterministic mode (they change float reductions) when it loads."""
    import torch

    def exact(x: Any) -> Any:  # a dict's keys by repr: {0: ..} and {"0": ..} differ, and mixed key types sort
        if isinstance(x, dict):
            return ("dict", sorted((repr(k), exact(v)) for k, v in x.items()))
        if isinstance(x, (list, tuple)):
            return (type(x).__name__, [exact(v) for v in x])
        return (type(x).__name__, repr(x))

    return repr((experiment.__name__, exact(data), int(data_seed), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()))


def _preload(experiment: ModuleType, data: dict[str, Any], data_seed: int) -> bool:
    """Load and keep the data (see the module doc); whether it was kept. It loads in an empty folder
    of its own: a load_data that opened a relative path, or left a file there, may depend on the
    folder it runs in (a trial's is its own), and is not kept; nor is one that moved a global RNG."""
    import random
    import shutil

    import numpy as np
    import torch

    def rng_states():
        return random.getstate(), np.random.get_state(legacy=False), torch.get_rng_state()

    key = _data_key(experiment, data, data_seed)  # (before load_data: it may change `data`)
    if not _AUDIT[1]:  # (a hook stays for the process's life: only a process that preloads gets it)
        sys.addaudithook(_audit_opens)
        _AUDIT[1] = True
    here, folder, relative = os.getcwd(), preload_folder(os.getpid()), []
    _sweep_preload_folders()
    shutil.rmtree(folder, ignore_errors=True)
    os.mkdir(folder, 0o700)
    _AUDIT[0] = relative
    before, cuda_before = rng_states(), torch.cuda.is_initialized()
    try:
        os.chdir(folder)
        loaded = experiment.load_data(data, data_seed)
    finally:
        _AUDIT[0] = None
        os.chdir(here)
        left = os.listdir(folder)
        shutil.rmtree(folder, ignore_errors=True)
    after = rng_states()
    same = before[0] == after[0] and _same_numpy_state(before[1], after[1]) and torch.equal(before[2], after[2])
    same = same and torch.cuda.is_initialized() == cuda_before  # (one that starts CUDA may draw from its RNGs: not compared)
    if same and not relative and not left:
        _PRELOADED[key] = loaded
        return True
    return False


def preload_folder(pid: int) -> str:
    """The empty folder process `pid` preloads in (removed after; a killed one's by the next preload)."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"hpolab-preload-{pid}")


def _sweep_preload_folders() -> None:
    """Remove the preload folders of processes that are gone (a standby killed while it loaded)."""
    import shutil

    root = os.path.dirname(preload_folder(0))
    for name in os.listdir(root):
        pid = name.removeprefix("hpolab-preload-")
        if name.startswith("hpolab-preload-") and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's)
        pass
    return True


_AUDIT: list = [None, False]  # while a preload runs, the list its relative opens go to; whether the hook is in


def _audit_opens(event: str, args: tuple) -> None:
    if _AUDIT[0] is not None and event in ("open", "os.listdir", "os.scandir") and args:
        path = args[0]
        if path is None or (isinstance(path, (str, bytes, os.PathLike)) and not os.path.isabs(path)):
            _AUDIT[0].append(path)


def _same_numpy_state(a: dict, b: dict) -> bool:
    import numpy as np

    return a["bit_generator"] == b["bit_generator"] and np.array_equal(a["state"]["key"], b["state"]["key"]) and \
        a["state"]["pos"] == b["state"]["pos"] and a["has_gauss"] == b["has_gauss"] and a["gauss"] == b["gauss"]


def _task(experiment: ModuleType):
    from .tasks import task_for

    return task_for(experiment)


def _describe(trial, experiment, config: dict[str, Any], result, model, data, notes: list[str], devices: int) -> None:
    """What the trial's summary says of the routine's run: its model (kept when the study logs models,
    the best epoch's weights), its examples, the objectives measured on the training device."""
    import torch

    from .checkpoint import load_checkpoint, load_model_state

    example = torch.stack([torch.as_tensor(data.val[i][0]) for i in range(min(2, len(data.val)))]).float()
    objectives = _objective_values(config, result, model, example, getattr(experiment, "costs", None)) if config.get("objectives") else None
    # The study logs models, and the best epoch's weights are here: in memory (it was the last), or in best.pt
    at_hand = result.best_epoch == result.epochs_run or result.best_checkpoint is not None
    keep = bool(getattr(trial, "keeps_model", False) and result.best_epoch and at_hand)
    if keep and result.best_epoch != result.epochs_run:
        load_model_state(model, load_checkpoint(result.best_checkpoint, map_location="cpu")["state"]["model"])
    model_cpu = model.to("cpu").eval()
    with torch.inference_mode():
        out = model_cpu(example)
    if keep:
        trial.log_model(model_cpu, example, epoch=result.best_epoch)
    trial.describe(model_from_checkpoint=True, input_shape=list(data.input_shape), num_classes=data.num_classes,
                   input_example=example.numpy(), output_example=out.float().numpy(), amp=result.amp, device=result.device,
                   devices=devices, notes=notes, stop_reason=result.stop_reason, objectives=objectives,
                   metrics_from="the experiment's metrics()")  # (its task's: the routine computes the epoch metrics)


def _objective_values(config: dict[str, Any], result, model, example, own_costs=None) -> dict[str, float]:
    """For a study with `objectives:`/`constraints:`: every epoch metric at the best epoch (picked by
    the pruning metric) and the cost metrics it asks for, measured now on the trial's device."""
    import torch

    from .costs import cost_metrics

    at_best = next((h for h in result.history if h.get("epoch") == result.best_epoch), result.last_metrics)
    values = {k: float(v) for k, v in at_best.items() if k != "epoch"}
    values.update(cost_metrics(config["cost_metrics"], model, example, torch.device(result.device), own_costs))
    return values
