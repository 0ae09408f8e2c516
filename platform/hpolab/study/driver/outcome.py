"""What one run of the driver did: why it ended, and the study's trials by state then."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outcome:
    signal: int | None = None  # the first SIGINT/SIGTERM received
    timed_out: bool = False
    failure_limit: str | None = None  # why the driver stopped after max_failures consecutive failures
    stopped: str | None = None  # why stop_after_no_improvement ended the study (a deliberate stop)
    budget_spent: bool = False  # budget.epochs used up: a planned end, even before any trial completed
    halted: str | None = None  # `hpolab study stop` ended it (control.py): a deliberate stop, exit 0
    counts: dict[str, int] = field(default_factory=dict)
    n_trials: int = 0

    @property
    def interrupted(self) -> bool:
        return self.signal is not None
