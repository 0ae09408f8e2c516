"""`hpolab study status NAME`: the trial table of a study, read from the Optuna storage."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hpolab.study.driver.progress import fmt_value
from hpolab.stores.optuna_sql import NOISE_PROBE
from hpolab.stores.paths import Stores
from hpolab.stores.trial_counts import count_trials, describe, epochs_used, last_reported, over_budget_note, paused_counts
from hpolab.stores.trial_states import shown


def print_status(name: str, stores: Stores, limit: int | None = None) -> int:
    """One row per trial (more than `limit`: the best, running/waiting and latest ones) and a summary
    line. A one-objective study on an embedded store or PostgreSQL is read with plain SQL
    (stores/optuna_sql.py: no Optuna import); anything else through Optuna."""
    code = _print_table(name, stores, limit)
    for line in steering_lines(name, stores):
        Console(highlight=False, width=200 if not Console().is_terminal else None).print(Text(line))
    return code


def _print_table(name: str, stores: Stores, limit: int | None) -> int:
    read = _read_sql(name, stores)
    if read is not None and len(read[0]) == 1:
        directions, rows = read
        return _print_trials(name, directions[0], rows, _best_row(rows, directions[0]), limit, lambda: _attrs_sql(name, stores))
    from hpolab.stores.optuna_storage import load_study  # (here: `study list` needs no Optuna)
    from hpolab.stores.optuna_sql import TrialRow, ranking_attrs

    study = load_study(name, stores)  # (a UserError naming the studies there when there is no such study)
    if len(study.directions) > 1:  # several objectives: the front, not one best value
        from hpolab.study.objectives.ranking import front_table

        trials = study.get_trials(deepcopy=False)
        console = Console(highlight=False, width=200 if not Console().is_terminal else None)
        table = front_table(study, name, limit=limit)
        console.print(table)
        if limit is not None and table.row_count == limit and len(trials) > limit:
            console.print(f"the first {limit} of {len(trials)} trials shown (complete by rank, then pruned, failed, running); "
                          "--all shows every trial")
        console.print(describe(count_trials(trials)))
        _print_noise(console, study.user_attrs)
        return 0
    from hpolab.study.objectives import ranking

    trials = study.get_trials(deepcopy=False)
    rows = [TrialRow(t.number, t.state.name, t.value, t.params, last_reported(t), t.user_attrs.get("mlflow_run_id"),
                     ranking_attrs(t.system_attrs)) for t in trials]
    top = ranking.best(trials, ranking.directions_of(study))  # (feasible, not imported by a warm start)
    return _print_trials(name, study.direction.name.lower(), rows, (top.number, top.value) if top is not None else None, limit,
                         lambda: study.user_attrs)


def _read_sql(name: str, stores: Stores):
    from hpolab.stores.optuna_sql import read_trials, source

    src = source(stores.optuna_url)  # an embedded store's file, or a PostgreSQL storage's URL
    return read_trials(src, name) if src is not None else None


def steering_lines(name: str, stores: Stores) -> list[str]:
    """The study's control (`study pause|resume|stop|set`) and who applied it; notifications dropped."""
    from hpolab.stores.control import CONTROL_ATTR, Control, applied_by
    from hpolab.stores.optuna_sql import read_study_system_attrs, source
    from hpolab.study.driver.notify import DROPPED_PREFIX

    src = source(stores.optuna_url)
    attrs = read_study_system_attrs(src, name) if src is not None else None
    if attrs is None:
        from hpolab.stores.optuna_storage import open_storage

        storage = open_storage(stores.optuna_url)
        attrs = storage.get_study_system_attrs(storage.get_study_id_from_name(name))
    lines = []
    control = Control.from_attr(attrs.get(CONTROL_ATTR))
    if control.version:
        lines.append(f"control: {control.describe()}")
        if control.values:
            lines.append("run controls set: " + ", ".join(f"{k}={v}" for k, v in control.values.items()))
        applied = applied_by(attrs, control.version)
        lines.append(f"applied (v{control.version}) by: " + (", ".join(f"{a.get('worker')} at {a.get('at')}" for a in applied)
                                                             or "no driver yet (a driver started later applies it too)"))
    dropped = [v for k, v in attrs.items() if k.startswith(DROPPED_PREFIX) and isinstance(v, dict)]
    if dropped:
        last = max(dropped, key=lambda v: str(v.get("at", "")))
        lines.append(f"notifications dropped: {sum(int(v.get('count', 0)) for v in dropped)} (the last: {last.get('last')}, at {last.get('at')})")
    return lines


BUDGET_ATTR = "hpolab.budget_epochs"  # study user attr: the spec's budget.epochs (the driver writes it)


def _attrs_sql(name: str, stores: Stores) -> dict:
    """The study's user attrs (its budget.epochs, its noise floor), read with plain SQL."""
    from hpolab.stores.optuna_sql import read_studies, source

    studies = read_studies(source(stores.optuna_url)) or []
    return next((s.user_attrs for s in studies if s.name == name), {})


def _print_noise(console: Console, attrs: dict) -> None:
    """The study's noise floor, when a promotion race or its noise probe measured one (study/objectives/noise.py)."""
    from hpolab.study.objectives.noise import describe as noise

    said = noise(attrs)
    if said:
        console.print(f"noise floor: {said}")


def epochs_line(rows: list, budget) -> str | None:
    """'epochs used: 16 / 40 (budget.epochs); 2 paused, 5 pruned at a rung' for a study with a
    trial scheduler or an epoch budget (None otherwise). Epochs used: the budget's own rule
    (trial_counts.epochs_used; a row's `steps` is its last epoch reported)."""
    paused = paused_counts(rows)
    if paused is None and budget is None:
        return None
    used = epochs_used(rows, last_epoch=lambda r: r.steps)
    line = f"epochs used: {used}" + (f" / {budget} (budget.epochs{over_budget_note(used, budget)})" if budget is not None else "")
    return line + (f"; {paused['paused']} paused, {paused['at_rung']} pruned at a rung (never promoted)" if paused is not None else "")


def _ranked_rows(rows: list, direction: str) -> list:
    """ranking.ranked's feasible COMPLETE trials (a warm start's imported ones aside), best first."""
    from hpolab.study.objectives import ranking  # (numpy, no Optuna)

    return [r for r in ranking.ranked(rows, [direction]) if ranking.feasible(r)]


def _best_row(rows: list, direction: str) -> tuple[int, float] | None:
    """ranking.best's trial: (number, value)."""
    from hpolab.study.objectives import ranking

    top = ranking.best(rows, [direction])
    return (top.number, top.value) if top is not None else None


# above the limit: the best COMPLETE trials, the first running/waiting ones (the longest running), the latest ones
BEST_SHOWN, RUNNING_SHOWN, LATEST_SHOWN = 20, 20, 10


def shown_rows(rows: list, direction: str, limit: int | None) -> list:
    """Every row up to `limit`; above it the BEST_SHOWN best (as _best_row ranks: feasible, not
    imported), the first RUNNING_SHOWN running or waiting ones and the LATEST_SHOWN latest, in trial order."""
    if limit is None or len(rows) <= limit:
        return rows
    keep = {r.number for r in _ranked_rows(rows, direction)[:BEST_SHOWN]}
    keep |= {r.number for r in [r for r in rows if r.state in ("RUNNING", "WAITING")][:RUNNING_SHOWN]}
    keep |= {r.number for r in rows[-LATEST_SHOWN:]}
    return [r for r in rows if r.number in keep]


def _print_trials(name: str, direction: str, all_rows: list, best: tuple[int, float] | None, limit: int | None = None,
                  attrs=dict) -> int:
    rows = shown_rows(all_rows, direction, limit)
    params = sorted({p for r in rows for p in r.params})
    table = Table(title=f"study {name} ({direction})")
    for col in ["trial", "state", "value", *[p.split(".")[-1] for p in params], "epochs", "mlflow run"]:
        table.add_column(col, justify="right" if col not in ("state", "mlflow run") else "left")
    # Cells we format are Text: rich then skips markup and emoji parsing per cell (a quarter of the
    # time of a 1,000-row table). A string param value stays a str, rendered exactly as before.
    for r in rows:
        table.add_row(
            Text(str(r.number)),
            Text(shown(r) + (" (noise probe)" if r.system_attrs.get(NOISE_PROBE) else "")),
            Text(f"{r.value:.4g}" if r.value is not None else "-"),
            *[_cell(r.params.get(p)) for p in params],
            Text(str(r.steps)),
            Text(str(r.run_id if r.run_id is not None else "-")),
        )
    console = Console(highlight=False, width=200 if not Console().is_terminal else None)
    console.print(table)
    if len(rows) < len(all_rows):
        console.print(f"{len(rows)} of {len(all_rows)} trials shown: the {BEST_SHOWN} best complete, the first {RUNNING_SHOWN} "
                      f"running or waiting, the {LATEST_SHOWN} latest; --all shows every trial")
    summary = describe(count_trials(all_rows))  # (the budget's rule: a retried attempt or an imported trial is no result)
    top = f"best: trial {best[0]} value {best[1]:.4g}" if best is not None else "best: none yet"
    console.print(f"{summary}; {top}")
    study_attrs = attrs()
    epochs = epochs_line(all_rows, study_attrs.get(BUDGET_ATTR))
    if epochs:
        console.print(epochs)
    _print_failures(console, all_rows)
    _print_noise(console, study_attrs)
    return 0


FAILURES_SHOWN = 3  # the latest failed trials whose reason and last output `study status` shows


def _print_failures(console: Console, rows: list) -> None:
    """The latest failed trials' reasons and last output lines (recorded when they failed)."""
    failed = [r for r in rows if r.state == "FAIL" and isinstance(r.system_attrs.get("hpolab.failure"), dict)][-FAILURES_SHOWN:]
    for r in failed:
        record = r.system_attrs["hpolab.failure"]
        console.print(Text(f"trial {r.number} failed: {record.get('reason', '')}"))
        for line in record.get("output") or []:
            console.print(Text(f"  | {line}"))


def _cell(v) -> Text | str:
    return v if isinstance(v, str) else Text(fmt_value(v))


def _best_cell(r) -> str:
    """One objective: the best value. Several: how many trials are on the feasible Pareto front."""
    if r.front_size is not None:
        return f"front: {r.front_size} trial{'s' * (r.front_size != 1)}"
    return f"{r.best_value:.4g}" if r.best_value is not None else "-"


def print_study_list(stores: Stores) -> int:
    """`hpolab study list`: one row per study in the Optuna storage."""
    from hpolab.stores.studies import list_studies
    from hpolab.study.objectives import ranking  # (numpy, no Optuna: it decides the best and the front)

    rows = list_studies(stores, ranking.front, ranking.best)
    console = Console(highlight=False, width=200 if not Console().is_terminal else None)
    if not rows:
        console.print(f"no studies in {stores.optuna_shown}; start one with: hpolab study run studies/digits_cnn.yaml")
        return 0
    table = Table(title=f"studies in {stores.optuna_shown}")
    for col in ("study", "direction", "metric", "complete", "pruned", "fail", "running", "paused", "best", "last activity"):
        table.add_column(col, justify="left" if col in ("study", "direction", "metric", "last activity") else "right")
    for r in rows:
        table.add_row(
            r.name,
            r.direction,
            ", ".join(r.objectives) if r.objectives else r.metric or "-",
            *(str(r.counts.get(k, 0)) for k in ("complete", "pruned", "fail", "running", "paused")),
            _best_cell(r),
            r.last_activity.strftime("%Y-%m-%d %H:%M:%S") if r.last_activity else "-",
        )
    console.print(table)
    return 0
