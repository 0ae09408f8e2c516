"""The spec's trial scheduler: `trial_scheduler: {type: asha | pbt, ...}` -> the object the driver asks
(the interface: trial_scheduler.py; ASHA: asha.py; PBT: pbt.py)."""

from __future__ import annotations

from hpolab.study.objectives.trial_scheduler import TrialScheduler


def scheduler_for(spec, stores) -> TrialScheduler | None:
    """The spec's trial scheduler (None without `trial_scheduler:`)."""
    ts = spec.trial_scheduler
    if ts is None:
        return None
    if ts.type == "asha":
        from hpolab.study.objectives.asha import Asha

        return Asha(spec, stores)
    from hpolab.study.objectives.pbt import Pbt

    return Pbt(spec, stores)
