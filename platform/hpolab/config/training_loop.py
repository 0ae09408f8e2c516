"""An experiment's training loop as a spec sees it, and the spec checked against it one way for every experiment.

The loop is the platform's built-in one (load_data + build_model + a task: the routine) or the
experiment's own `train(config, trial)` (config/experiment.py tells them apart). Either declares the
metrics a study may name, with their directions: the task's metric_directions, or an own loop's
optional `METRIC_DIRECTIONS = {"val_acc": "maximize", ...}` (without it the spec's names are trusted,
and a trial whose reports never carry the study metric fails saying so). The spec's metric,
objectives, constraints and COSTS are checked against that declaration by the same code.

What only the built-in loop can do is a capability its `train` function carries (train/builtin.py),
read here as any loop's would be, not a branch on which loop it is:
- `builds_model`: several devices per trial (DDP ranks run fit()), the LR range test, `doctor` and
  `lr-find` (they build the model and data themselves). A spec that asks one of a loop without it is
  refused in one line;
- `task()`: the task that declares its metrics (else the loop's METRIC_DIRECTIONS, or the spec's names);
- `takes_every_trainer_option`: its run records the whole trainer config (else only the options the
  spec set or the trial changed: the others are defaults the loop may never have read).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from hpolab.config.objectives import declared_costs, experiment_cost_problems, objective_problems
from hpolab.errors import UserError

OWN = "an own training loop (train(config, trial))"


@dataclass(frozen=True)
class Loop:
    """What an experiment's training loop declares and can do."""

    direction_of: Callable[[str], str | None]  # a metric's direction; None: not one of its metrics
    metric_problems: Callable[[str, str], list[str]]  # a one-metric spec's (metric, direction) against the declaration
    declares_metrics: bool  # False: an own loop without METRIC_DIRECTIONS (the spec's names are trusted)
    builds_model: bool  # the built-in loop: DDP ranks, the LR range test, doctor and lr-find
    config_problems: tuple[str, ...] = ()  # trainer options the loop does not take
    declaration_problems: tuple[str, ...] = ()  # what is wrong with its declaration (then no metric is checked)


def _train(exp: ModuleType):
    from hpolab.config.experiment import train_of

    return train_of(exp)


def loop_of(spec, exp: ModuleType) -> tuple[Loop | None, list[str]]:
    """The experiment's loop, or None with the problems that keep it from being read."""
    train = _train(exp)
    task_of = getattr(train, "task", None)
    return _task_loop(spec, task_of) if task_of is not None else _declared_loop(spec, exp)


def _task_loop(spec, task_of: Callable) -> tuple[Loop | None, list[str]]:
    from hpolab.train.tasks import metric_problems

    try:
        task = task_of()
    except ValueError as e:
        return None, [f"experiment: {e}"]

    def direction_of(metric: str) -> str | None:
        return "minimize" if metric == "train_loss" else task.direction_of(metric, spec.trainer)

    return Loop(direction_of, lambda metric, direction: metric_problems(task, spec.trainer, metric, direction),
                declares_metrics=True, builds_model=True, config_problems=tuple(task.check_config(spec.trainer))), []


def _declared_loop(spec, exp: ModuleType) -> tuple[Loop | None, list[str]]:
    problems = train_signature_problems(spec, exp)
    if problems:
        return None, problems
    declared = getattr(exp, "METRIC_DIRECTIONS", None)
    if declared is None:  # trusted: each name means what the spec says (constraints name any metric the reports carry)
        trusted = {o.metric: o.direction for o in spec.objective_list}
        return Loop(lambda metric: trusted.get(metric, "trusted"), lambda metric, direction: [],
                    declares_metrics=False, builds_model=False), []
    bad = [f"{k}: {v!r}" for k, v in dict(declared).items() if v not in ("maximize", "minimize")] if isinstance(declared, dict) else ["not a dict"]
    if bad or not declared:
        why = (f"experiment: METRIC_DIRECTIONS of {spec.experiment} must map metric names to 'maximize' or "
               f"'minimize'; problems: {', '.join(bad) or 'it is empty'}")
        return Loop(lambda metric: None, lambda metric, direction: [], declares_metrics=False, builds_model=False,
                    declaration_problems=(why,)), []
    return Loop(declared.get, lambda metric, direction: _declared_metric_problems(spec, declared, metric, direction),
                declares_metrics=True, builds_model=False), []


def loop_problems(spec, exp: ModuleType) -> list[str]:
    """Everything the spec asks of the experiment's loop: capabilities, metrics, objectives, costs, options."""
    loop, problems = loop_of(spec, exp)
    if loop is None:
        return problems
    if not loop.builds_model:
        if spec.trainer.devices > 1:
            problems.append(f"trainer.devices: {spec.trainer.devices} needs the platform's routine (DDP ranks); {OWN} runs in "
                            "one process on one device: set trainer.devices: 1")
        if spec.lr_range_test.enabled:
            problems.append(f"lr_range_test.enabled: the LR range test needs build_model/load_data (the platform's routine); "
                            f"{OWN} has none: set lr_range_test.enabled: false")
    if loop.declaration_problems:
        return problems + list(loop.declaration_problems)
    if spec.objectives or spec.constraints:  # (a one-metric study without constraints never measures costs)
        problems += experiment_cost_problems(exp, loop.direction_of if loop.declares_metrics else lambda metric: None)
        problems += objective_problems(spec, loop.direction_of, declared_costs(exp))
    if not spec.objectives:
        problems += loop.metric_problems(spec.metric, spec.direction)
    return problems + list(loop.config_problems)


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


def _declared_metric_problems(spec, declared: dict[str, str], metric: str, direction: str) -> list[str]:
    where = f"METRIC_DIRECTIONS of experiment {spec.experiment}"
    want = declared.get(metric)
    if want is None:
        return [f"metric: {metric!r} is not in the {where} (declared: {', '.join(sorted(declared))}); "
                "use one of them or declare it there"]
    if direction != want:
        return [f"direction: {metric} should be {want[:-1]}ed ({where}); set direction: {want}"]
    return []


def require_builtin_loop(exp: ModuleType, command: str) -> None:
    """UserError (exit 2) for a command that builds the model and data itself (doctor, lr-find)."""
    if not getattr(_train(exp), "builds_model", False):
        raise UserError(f"experiment {exp.__name__.rpartition('.')[2]} brings its own training loop (train(config, trial)); "
                        f"hpolab {command} needs the load_data/build_model contract")


def recorded_config(spec, config: dict[str, Any], exp: ModuleType) -> dict[str, Any]:
    """What a trial run records as params: the config (the built-in loop uses every trainer option), or
    for an own loop its config with only the trainer: keys the spec set and those this trial's config
    changed (sampled, a retry's halved batch, a trial scheduler's): the routine's other options are
    defaults the loop may never have used (trial.log_params records what it did use)."""
    if getattr(_train(exp), "takes_every_trainer_option", False):
        return config
    given = spec.trainer_dict()
    trainer = {k: v for k, v in config["trainer"].items() if k in spec._trainer_keys or given.get(k) != v}
    return {**config, "trainer": trainer}
