"""How a study's trials count: one rule for the budget (study/state/budget.py: what `n_trials` and
`budget.epochs` mean), the progress line, `study list`, `study status` and the report -- so they all
say the same numbers.

A trial counts under its state (complete, pruned, fail, running, waiting; `paused`: RUNNING in Optuna
but paused by a trial scheduler, with no process: is_paused below), except:
- `retried`: a FAIL attempt that a later trial retries (its number is in that trial's
  `retry_history`: an attempt interrupted by Ctrl-C/SIGTERM, a dead driver, an OOM or timeout, resumed
  by its copy). The copy is what counts, so an interrupted and resumed study has no failures.
- `imported`: a trial a warm start copied from another study (`hpolab.imported_from`): history for
  the sampler, not a result of this study.
- `released`: a trial a worker gave back unrun because the budget was already full (`hpolab.released`).
`finished` = complete + pruned + fail; n_trials budgets finished + running + paused + waiting.
Epochs (`budget.epochs`): per configuration (a retry chain, one trial across a trial scheduler's
pauses), the last epoch it reported; imported and released trials count none.

Plain data in, no Optuna: the SQL readers (optuna_sql.py) and Optuna's FrozenTrial both fit. Also
the one home of the paused mark and its tests (is it paused now, was it pruned at a rung), since
`study status` and `study list` import this module without Optuna.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from hpolab.stores.optuna_sql import IMPORTED

RELEASED = "hpolab.released"  # system attr of a trial given back unrun because the budget was already full
PAUSED = "hpolab.paused"  # system attr {rung, epoch} of a trial a trial scheduler paused (None once resumed)
RETRY_HISTORY = "retry_history"  # system attr of a retry copy: the numbers of the attempts it continues (the first: its chain's root)
COUNTED_STATES = ("complete", "pruned", "fail", "running", "paused", "waiting")
ASIDE = {"retried": "attempt{s} retried", "imported": "imported by a warm start", "released": "released unrun"}


def _state_name(state: Any) -> str:
    """An Optuna TrialState or its name -> "RUNNING", "PRUNED", ..."""
    return str(getattr(state, "name", state)).upper()


def is_paused(state: Any, system_attrs: dict[str, Any]) -> bool:
    """Paused by a trial scheduler now: RUNNING in Optuna (it has no paused state), with no process."""
    return _state_name(state) == "RUNNING" and isinstance(system_attrs.get(PAUSED), dict)


def pruned_at_rung(state: Any, system_attrs: dict[str, Any]) -> bool:
    """Ended PRUNED while paused (never promoted or resumed): the trial scheduler's end of it."""
    return _state_name(state) == "PRUNED" and PAUSED in system_attrs


def paused_counts(trials: Iterable) -> dict[str, int] | None:
    """{"paused": paused now, "at_rung": pruned at a rung} in one pass over `trials`; None when no
    trial was ever paused (no trial scheduler, or none paused yet)."""
    out, scheduled = {"paused": 0, "at_rung": 0}, False
    for t in trials:
        scheduled = scheduled or PAUSED in t.system_attrs
        out["paused"] += is_paused(t.state, t.system_attrs)
        out["at_rung"] += pruned_at_rung(t.state, t.system_attrs)
    return out if scheduled else None


def chain_root(trial) -> int:
    """The first attempt of the trial's retry chain (itself when it is no retry copy): a copy is the
    same configuration at the same place in a trial scheduler's schedule as the attempt it continues.
    (study/state/retry.py writes `failed_trial` too, always the same number.)"""
    return int((trial.system_attrs.get(RETRY_HISTORY) or [trial.number])[0])


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
        if t.system_attrs.get(RELEASED) or t.system_attrs.get(IMPORTED):
            continue
        root = chain_root(t)
        last[root] = max(last.get(root, 0), last_epoch(t))
    return sum(last.values())


def over_budget_note(used: int, budget: int | None) -> str:
    """The epochs past budget.epochs, said: the last segment started before it was spent trains to its rung."""
    return f"; {used - budget} over: the last segments started trained to their rung" if budget is not None and used > budget else ""


def retried_numbers(trials: Iterable) -> set[int]:
    """Numbers of the attempts some retry copy continues."""
    return {n for t in trials for n in (t.system_attrs.get(RETRY_HISTORY) or [])}


def count_trials(trials: Iterable) -> dict[str, int]:
    """Counts by the rule above. `trials`: each with `number`, `state` (Optuna's TrialState or its
    name) and `system_attrs` (at least the marks read here)."""
    trials = list(trials)
    retried = retried_numbers(trials)
    counts = {k: 0 for k in (*COUNTED_STATES, "retried")}
    for t in trials:
        state = str(getattr(t.state, "name", t.state)).lower()
        if t.system_attrs.get(RELEASED):
            counts["released"] = counts.get("released", 0) + 1
        elif t.system_attrs.get(IMPORTED):
            counts["imported"] = counts.get("imported", 0) + 1
        elif state == "fail" and t.number in retried:
            counts["retried"] += 1
        elif is_paused(state, t.system_attrs):
            counts["paused"] += 1
        elif state in counts:
            counts[state] += 1
    counts["finished"] = counts["complete"] + counts["pruned"] + counts["fail"]
    return counts


def in_budget(counts: dict[str, int]) -> int:
    """Trials that fill n_trials: finished, running, paused (they go on) and waiting (retry copies)."""
    return counts["finished"] + counts["running"] + counts["paused"] + counts["waiting"]


def describe(counts: dict[str, int]) -> str:
    """'3 complete, 1 pruned (2 attempts retried: not counted)': the counted states that are not 0,
    then what is left out."""
    shown = ", ".join(f"{counts[k]} {k}" for k in sorted(COUNTED_STATES) if counts.get(k))
    aside = ", ".join(f"{counts[k]} {text.format(s='s' * (counts[k] != 1))}" for k, text in ASIDE.items() if counts.get(k))
    return (shown or "no trials") + (f" ({aside}: not counted)" if aside else "")
