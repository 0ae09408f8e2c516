"""How a study's trials count: one rule for the budget (study/state/budget.py: what `n_trials` and
`budget.epochs` mean), the progress line, `study list`, `study status` and the report -- so they all
say the same numbers.

A trial counts under its hpolab state (stores/trial_states.py: complete, pruned, fail, running and
claimed as running, waiting, paused and put back as paused), except:
- `retried`: a FAIL attempt that a later trial retries (its number is in that trial's
  `retry_history`: an attempt interrupted by Ctrl-C/SIGTERM, a dead driver, an OOM or timeout, resumed
  by its copy). The copy is what counts, so an interrupted and resumed study has no failures.
- `imported`: a trial a warm start copied from another study (`hpolab.imported_from`): history for
  the sampler, not a result of this study.
- `released`: a trial a worker gave back unrun because the budget was already full (`hpolab.released`).
`finished` = complete + pruned + fail; n_trials budgets finished + running + paused + waiting.
Epochs (`budget.epochs`): per configuration (a retry chain, one trial across a trial scheduler's
pauses), the last epoch it reported; imported and released trials count none.

Plain data in, no Optuna: the SQL readers (optuna_sql.py) and Optuna's FrozenTrial both fit, so
`study status` and `study list` import this module without Optuna.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from hpolab.stores.trial_states import PAUSED_STATES, State, chain_root, ended_at_rung, ever_paused, state_of, states

COUNTED_STATES = ("complete", "pruned", "fail", "running", "paused", "waiting")
ASIDE_TEXT = {"retried": "attempt{s} retried", "imported": "imported by a warm start", "released": "released unrun"}
# hpolab state -> the count it adds to
COUNTED_AS = {State.COMPLETE: "complete", State.PRUNED: "pruned", State.FAILED: "fail", State.RUNNING: "running",
              State.CLAIMED: "running", State.PAUSED: "paused", State.PUT_BACK: "paused", State.WAITING: "waiting",
              State.RETRIED: "retried", State.RELEASED: "released", State.IMPORTED: "imported"}


def paused_counts(trials: Iterable) -> dict[str, int] | None:
    """{"paused": paused now, "at_rung": pruned at a rung} in one pass over `trials`; None when no
    trial was ever paused (no trial scheduler, or none paused yet)."""
    out, scheduled = {"paused": 0, "at_rung": 0}, False
    for t, state in states(trials):
        scheduled = scheduled or ever_paused(t)
        out["paused"] += state in PAUSED_STATES
        out["at_rung"] += ended_at_rung(t)
    return out if scheduled else None


def last_reported(trial) -> int:
    """The last epoch an Optuna trial reported (0: none)."""
    return max(trial.intermediate_values, default=0)


def epochs_used(trials: Iterable, last_epoch: Callable[[Any], int] = last_reported) -> int:
    """Epochs trained by the study's trials (`budget.epochs`): per configuration, the last epoch it
    reported (a copy carries its attempt's epochs over, and a paused trial goes on from where it
    was: not counted twice). `last_epoch`: a trial's last reported epoch (a `study status` row: its
    highest step, read with SQL; not the count of its steps, which a copy that skipped a NaN epoch
    has fewer of)."""
    last: dict[int, int] = {}
    for t in trials:
        if state_of(t) in (State.RELEASED, State.IMPORTED):
            continue
        root = chain_root(t)
        last[root] = max(last.get(root, 0), last_epoch(t))
    return sum(last.values())


def over_budget_note(used: int, budget: int | None) -> str:
    """The epochs past budget.epochs, said: the last segment started before it was spent trains to its rung."""
    return f"; {used - budget} over: the last segments started trained to their rung" if budget is not None and used > budget else ""


def count_trials(trials: Iterable) -> dict[str, int]:
    """Counts by the rule above. `trials`: each with `number`, `state` (Optuna's TrialState or its
    name) and `system_attrs` (at least the marks read here)."""
    counts = {k: 0 for k in (*COUNTED_STATES, "retried")}
    for _, state in states(trials):
        key = COUNTED_AS[state]
        counts[key] = counts.get(key, 0) + 1
    counts["finished"] = counts["complete"] + counts["pruned"] + counts["fail"]
    return counts


def in_budget(counts: dict[str, int]) -> int:
    """Trials that fill n_trials: finished, running, paused (they go on) and waiting (retry copies)."""
    return counts["finished"] + counts["running"] + counts["paused"] + counts["waiting"]


def describe(counts: dict[str, int]) -> str:
    """'3 complete, 1 pruned (2 attempts retried: not counted)': the counted states that are not 0,
    then what is left out."""
    shown = ", ".join(f"{counts[k]} {k}" for k in sorted(COUNTED_STATES) if counts.get(k))
    aside = ", ".join(f"{counts[k]} {text.format(s='s' * (counts[k] != 1))}" for k, text in ASIDE_TEXT.items() if counts.get(k))
    return (shown or "no trials") + (f" ({aside}: not counted)" if aside else "")
