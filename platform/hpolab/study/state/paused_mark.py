"""The state a table shows for a trial: PAUSED for a trial scheduler's paused trial.

Optuna has no paused state: a paused trial stays RUNNING with the system attr hpolab.paused =
{rung, epoch} (driver/pauses.py). It has no process and is not finished, so the tables (the end of
`study run`, `study status`, `compare`, Study.trials_df) say PAUSED. Plain data: no imports, for the
light read paths.
"""

from __future__ import annotations

from typing import Any

PAUSED_ATTR = "hpolab.paused"


def shown_state(state: Any, system_attrs: dict[str, Any]) -> str:
    """`state`: an Optuna TrialState or its name."""
    name = str(getattr(state, "name", state))
    return "PAUSED" if name == "RUNNING" and isinstance(system_attrs.get(PAUSED_ATTR), dict) else name
