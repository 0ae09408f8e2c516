"""The promotion gate of a study of several objectives, as a pure function: every objective is checked.

Each objective gets a gate value for the challenger and for the alias holder:
- an epoch metric (val_acc, val_rmse, ...) is its held-out test counterpart (acc, rmse, ...): both
  models are scored on the same test split, as in a one-objective study;
- a cost metric (params, model_mb, latency_ms, the experiment's own) is a property of the trained
  model, not of the data: the value its trial measured after training (latency on the trial's
  device). The holder's come from its version's tags `hpolab.objective.<name>`, written when it was
  promoted; a holder without one (promoted from a one-objective study) is not compared on it.

The challenger is refused when the holder is at least as good on every compared objective (it
would dominate or equal the challenger: nothing gained), and when a bound of the user's --pick rule
that held on validation does not hold on the test values (val_acc>=0.97 is checked as test acc >= 0.97).
A challenger better on one objective and worse on another is promoted: the rule the user stated chose
that trade-off. `--force` turns a refusal into a promotion, with the reason saying so.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpolab.registry.gate import PROMOTE, REFUSE, Contest, Decision, already_champion
from hpolab.registry.pick import OPS

TAG_OBJECTIVE = "hpolab.objective."  # + objective name, on a model version: its gate value


def gate_values(objectives: list[str], test: Mapping[str, float], recorded: Mapping[str, float]) -> dict[str, float]:
    """Objective -> gate value: a val_ metric's test counterpart (none: not compared, a validation
    value is no test result), else the trial's recorded value (cost metrics)."""
    out = {}
    for name in objectives:
        if name.startswith("val_"):
            if name[len("val_"):] in test:
                out[name] = float(test[name[len("val_"):]])
        elif name in recorded:
            out[name] = float(recorded[name])
    return out


def holder_values(objectives: list[str], test: Mapping[str, float] | None, tags: Mapping[str, str]) -> dict[str, float] | None:
    """The alias holder's gate values: its test metrics where comparable, its recorded cost values."""
    if test is None:
        return None
    recorded = {}
    for name in objectives:
        try:
            recorded[name] = float(tags[TAG_OBJECTIVE + name])
        except (KeyError, ValueError):
            pass
    return gate_values(objectives, test, recorded)


def _source(name: str) -> str:
    return f"test_{name[len('val_'):]}" if name.startswith("val_") else name


def decide(challenger: Mapping[str, float], holder: Mapping[str, float] | None, directions: Mapping[str, str],
           bounds: tuple[tuple[str, str, float], ...], force: bool, contest: Contest,
           bound_values: Mapping[str, float] | None = None) -> Decision:
    """Promote or refuse on every objective (`directions`: objective -> maximize | minimize, in order).
    `bound_values`: the gate values of the metrics the --pick bounds name (default: `challenger`)."""
    already = already_champion(contest)
    if already is not None:
        return already
    c = contest

    def refuse(why: str) -> Decision:
        if not force:
            return Decision(REFUSE, f"REFUSED: {why}. Nothing changed; --force moves the alias anyway.")
        return Decision(PROMOTE, f"{why}; --force: moving the alias anyway")

    at = challenger if bound_values is None else bound_values
    broken = [f"{m}{op}{v:g} ({_source(m)} {at[m]:.4g})" for m, op, v in bounds if m in at and not OPS[op](at[m], v)]
    if broken:
        return refuse(f"the challenger (trial {c.trial} of {c.study}) met the --pick bounds on validation but not on the "
                      f"held-out test split: {', '.join(broken)}")
    if c.champion_version is None:
        return Decision(PROMOTE, f"{c.model}@{c.alias} does not exist yet: the challenger takes it")
    if holder is None:
        return refuse(f"the current {c.alias} (version {c.champion_version}) cannot be compared: {c.not_comparable}")
    compared = [m for m in directions if m in challenger and m in holder]
    if not compared:
        return refuse(f"the current {c.alias} (version {c.champion_version}) shares no objective value with the challenger")
    better, worse, parts = [], [], []
    for m in compared:
        sign = 1 if directions[m] == "maximize" else -1
        d = sign * (challenger[m] - holder[m])
        (better if d > 0 else worse if d < 0 else []).append(m)
        parts.append(f"{_source(m)} {challenger[m]:.4g} vs {holder[m]:.4g} ({directions[m]})")
    skipped = [m for m in directions if m not in compared]
    cmp = "; ".join(parts) + (f"; not compared: {', '.join(skipped)} (no value on one side)" if skipped else "")
    if not better:
        return refuse(f"the challenger (trial {c.trial} of {c.study}) is better than {c.model}@{c.alias} "
                      f"(version {c.champion_version}) on no objective: {cmp}")
    trade = f", worse on {', '.join(worse)} (the trade-off --pick chose)" if worse else ""
    return Decision(PROMOTE, f"the challenger beats {c.alias} version {c.champion_version} on "
                             f"{', '.join(better)}{trade}: {cmp}")
