"""A spec whose experiment brings its own training loop (`train(config, trial)`): what it can ask for.

The loop is the experiment's, so the routine's task does not say which metrics exist. An experiment
may declare them (`METRIC_DIRECTIONS = {"val_acc": "maximize", ...}`): the spec's metric, objectives
and constraints are then checked against it here; without it the spec's names are trusted, and a trial
whose reports never carry the study metric fails saying so (study/trials/own_loop.py).

Its `train` must take (config, trial). What only the routine can do is refused: several devices per
trial (DDP ranks run fit()), and the LR range test (it builds the model and data itself).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from hpolab.config.objectives import declared_costs, experiment_cost_problems, objective_problems
from hpolab.errors import UserError


def refuse_own_loop(exp: ModuleType, command: str) -> None:
    """UserError (exit 2) for a command that builds the model and data itself (doctor, lr-find)."""
    from hpolab.config.experiment import is_own_loop

    if is_own_loop(exp):
        raise UserError(f"experiment {exp.__name__.rpartition('.')[2]} brings its own training loop (train(config, trial)); "
                        f"hpolab {command} needs the load_data/build_model contract")


def train_signature_problems(spec, exp: ModuleType) -> list[str]:
    """An experiment's `train` must take (config, trial): a module whose own `train` has another signature
    (PyTorch's MNIST example has `train(args, model, device, train_loader, optimizer, epoch)`) would make
    every trial fail on the call."""
    import inspect

    try:
        signature = inspect.signature(exp.train)
    except (TypeError, ValueError):  # (a builtin or C callable: nothing to read)
        return []
    try:
        signature.bind(None, None)
    except TypeError:
        return [f"experiment: {spec.experiment} defines train{signature}; an own-loop experiment defines train(config, trial) "
                "(rename the existing function, e.g. to train_epoch)"]
    return []


def own_loop_problems(spec, exp: ModuleType) -> list[str]:
    problems = train_signature_problems(spec, exp)
    if problems:
        return problems
    if spec.trainer.devices > 1:
        problems.append(f"trainer.devices: {spec.trainer.devices} needs the platform's routine (DDP ranks); an own training "
                        "loop (train(config, trial)) runs in one process on one device: set trainer.devices: 1")
    if spec.lr_range_test.enabled:
        problems.append("lr_range_test.enabled: the LR range test needs build_model/load_data (the platform's routine); "
                        "an own training loop (train(config, trial)) has none: set lr_range_test.enabled: false")
    declared = getattr(exp, "METRIC_DIRECTIONS", None)
    if declared is not None:
        bad = [f"{k}: {v!r}" for k, v in dict(declared).items() if v not in ("maximize", "minimize")] if isinstance(declared, dict) else ["not a dict"]
        if bad or not declared:
            return problems + [f"experiment: METRIC_DIRECTIONS of {spec.experiment} must map metric names to 'maximize' or "
                               f"'minimize'; problems: {', '.join(bad) or 'it is empty'}"]
        direction_of = declared.get
    else:  # trusted: each name means what the spec says (constraints name any metric the reports carry)
        trusted = {o.metric: o.direction for o in spec.objective_list}
        direction_of = lambda metric: trusted.get(metric, "trusted")  # noqa: E731
    if spec.objectives or spec.constraints:
        problems += experiment_cost_problems(exp, direction_of if declared is not None else lambda metric: None)
        problems += objective_problems(spec, direction_of, declared_costs(exp))
    elif declared is not None:
        problems += _metric_problems(spec, declared)
    return problems


def _metric_problems(spec, declared: dict[str, str]) -> list[str]:
    where = f"METRIC_DIRECTIONS of experiment {spec.experiment}"
    want = declared.get(spec.metric)
    if want is None:
        return [f"metric: {spec.metric!r} is not in the {where} (declared: {', '.join(sorted(declared))}); "
                "use one of them or declare it there"]
    if spec.direction != want:
        return [f"direction: {spec.metric} should be {want[:-1]}ed ({where}); set direction: {want}"]
    return []


def recorded_config(spec, config: dict[str, Any], exp: ModuleType) -> dict[str, Any]:
    """What a trial run records as params: the config (the routine's trials), or for an own loop its
    config with only the trainer: keys the spec set and those this trial's config changed (sampled, a
    retry's halved batch, a trial scheduler's): the routine's other options are defaults the loop may
    never have used (trial.log_params records what it did use)."""
    from hpolab.config.experiment import is_own_loop

    if not is_own_loop(exp):
        return config
    given = spec.trainer_dict()
    trainer = {k: v for k, v in config["trainer"].items() if k in spec._trainer_keys or given.get(k) != v}
    return {**config, "trainer": trainer}
