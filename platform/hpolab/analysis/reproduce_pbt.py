"""`hpolab reproduce RUN_ID` of a PBT member: its schedule replayed as one run from scratch (Ray Tune's
PBT replay).

A member's schedule (the user attr hpolab.pbt_schedule of its Optuna trial: the mutated keys' values
from each epoch on) is replayed on the run's config.yaml: training starts from scratch with the values
of epoch 1, stops after the epoch before each change and resumes from its own checkpoint with the new
values (the optimizer keeps its moments and takes the new settings, as the member's resume did). The
exploits are not replayed: nothing is copied from another member, so after the member's first
exploit the replay trains weights of its own. Hence what is compared: every metric up to the first
exploit (the same numbers as the member's, like any reproduction), after it only `lr` (the schedule
the optimizer followed); the later epochs are shown side by side.

model.* and data.* keys can only take effect from epoch 1 (the model and data are built once).
"""

from __future__ import annotations

import re
from typing import Any

from hpolab.study.objectives.pbt import PARENTS_TAG, members_of, schedule_of
from hpolab.study.objectives.trial_scheduler import chain_root


def member_schedule(stores, tags: dict[str, str]) -> list[tuple[int, dict[str, Any]]] | None:
    """The schedule of the member whose attempt the run is, by first epoch; None when the run is not a PBT member's."""
    study_name, number = tags.get("optuna.study"), tags.get("optuna.trial_number")
    if study_name is None or number is None or "hpolab.resumed_after_epoch" not in tags:
        return None  # never resumed: not a member that went past a boundary
    from hpolab.errors import UserError
    from hpolab.stores.optuna_storage import load_study

    try:
        study = load_study(study_name, stores)
    except UserError:
        return None
    trials = study.get_trials(deepcopy=False)
    if int(number) >= len(trials):
        return None
    return schedule_of(members_of(trials)[chain_root(trials[int(number)])]) or None


def first_exploit(tags: dict[str, str]) -> int | None:
    """The boundary epoch of the member's first exploit (tag hpolab.pbt_parents, "3@4,5@8"); None when it never exploited."""
    epochs = [int(m) for m in re.findall(r"@(\d+)", tags.get(PARENTS_TAG, ""))]
    return min(epochs) if epochs else None


def apply(config: dict[str, Any], trainer: dict[str, Any], values: dict[str, Any], epoch: int, console) -> None:
    """Dotted keys into the trainer (any epoch) or the config's model/data sections (epoch 1 only)."""
    for key, value in values.items():
        section, name = key.split(".", 1)
        if section == "trainer":
            trainer[name] = list(value) if isinstance(value, tuple) else value
        elif epoch <= 1:
            config[section][name] = value
        elif config[section].get(name) != value:
            console.print(f"  [yellow]note[/]: {key} = {value!r} from epoch {epoch} is not replayed (the {section} is built once)")


def describe(schedule: list[tuple[int, dict[str, Any]]]) -> str:
    parts = [f"epoch {e}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(values.items()))
             for e, values in schedule]
    return "; ".join(parts)


def segments(schedule: list[tuple[int, dict[str, Any]]], epochs: int) -> list[tuple[int, int, dict[str, Any]]]:
    """(first epoch, last epoch, values from the first epoch on) of each stretch with the same values, up to `epochs`."""
    starts = [(max(e, 1), values) for e, values in schedule if e <= epochs]
    if not starts or starts[0][0] != 1:
        starts.insert(0, (1, {}))
    ends = [s for s, _ in starts[1:]] + [epochs + 1]
    return [(s, end - 1, values) for (s, values), end in zip(starts, ends)]
