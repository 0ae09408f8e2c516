"""The state a table shows for a trial: PAUSED for a trial scheduler's paused trial.

Optuna has no paused state: a paused trial stays RUNNING with the system attr hpolab.paused =
{rung, epoch, ...} (driver/pauses.py; trial_scheduler.py lists its fields). It has no process and is not finished, so the tables (the end of
`study run`, `study status`, `compare`, Study.trials_df) say PAUSED. The mark and its test live in
stores/trial_counts.py (plain data, no Optuna: the light read paths import it).
"""

from __future__ import annotations

from typing import Any

from hpolab.stores.trial_counts import is_paused


def shown_state(state: Any, system_attrs: dict[str, Any]) -> str:
    """`state`: an Optuna TrialState or its name."""
    return "PAUSED" if is_paused(state, system_attrs) else str(getattr(state, "name", state))
