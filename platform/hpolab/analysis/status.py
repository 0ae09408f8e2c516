"""`hpolab study status NAME`: the trial table of a study, read from the Optuna storage."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hpolab.study.progress import fmt_value
from hpolab.stores.paths import Stores, redact


def print_status(name: str, stores: Stores) -> int:
    from hpolab.stores.optuna_storage import load_study  # (here: `study list` needs no Optuna)

    study = load_study(name, stores)
    if len(study.directions) > 1:  # several objectives: the front, not one best value
        from hpolab.study.front_table import front_table

        Console(highlight=False, width=200 if not Console().is_terminal else None).print(front_table(study, name))
        return 0
    trials = study.get_trials(deepcopy=False)
    params = sorted({p for t in trials for p in t.params})
    table = Table(title=f"study {name} ({study.direction.name.lower()})")
    for col in ["trial", "state", "value", *[p.split(".")[-1] for p in params], "epochs", "mlflow run"]:
        table.add_column(col, justify="right" if col not in ("state", "mlflow run") else "left")
    # Cells we format are Text: rich then skips markup and emoji parsing per cell (a quarter of the
    # time of a 1,000-row table). A string param value stays a str, rendered exactly as before.
    for t in trials:
        table.add_row(
            Text(str(t.number)),
            Text(t.state.name),
            Text(f"{t.value:.4g}" if t.value is not None else "-"),
            *[_cell(t.params.get(p)) for p in params],
            Text(str(len(t.intermediate_values))),
            Text(str(t.user_attrs.get("mlflow_run_id", "-"))),
        )
    console = Console(highlight=False, width=200 if not Console().is_terminal else None)
    console.print(table)
    states = {}
    for t in trials:
        states[t.state.name] = states.get(t.state.name, 0) + 1
    summary = ", ".join(f"{v} {k.lower()}" for k, v in sorted(states.items())) or "no trials"
    from hpolab.study import ranking

    top = ranking.best(trials, ranking.directions_of(study))  # (feasible, not imported by a warm start)
    best = f"best: trial {top.number} value {top.value:.4g}" if top is not None else "best: none yet"
    console.print(f"{summary}; {best}")
    return 0


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

    def front(trials, directions):  # (Optuna is imported only for a study of several objectives)
        from hpolab.study.ranking import front

        return front(trials, directions)

    rows = list_studies(stores, front)
    console = Console(highlight=False, width=200 if not Console().is_terminal else None)
    if not rows:
        console.print(f"no studies in {redact(stores.optuna_url)}; start one with: hpolab study run studies/digits_cnn.yaml")
        return 0
    table = Table(title=f"studies in {redact(stores.optuna_url)}")
    for col in ("study", "direction", "metric", "complete", "pruned", "fail", "running", "best", "last activity"):
        table.add_column(col, justify="left" if col in ("study", "direction", "metric", "last activity") else "right")
    for r in rows:
        table.add_row(
            r.name,
            r.direction,
            ", ".join(r.objectives) if r.objectives else r.metric or "-",
            *(str(r.counts.get(k, 0)) for k in ("complete", "pruned", "fail", "running")),
            _best_cell(r),
            r.last_activity.strftime("%Y-%m-%d %H:%M:%S") if r.last_activity else "-",
        )
    console.print(table)
    return 0
