"""`hpolab compare`: the trials of a study as one table, or any runs side by side.

`hpolab compare NAME` joins the Optuna study (state, sampled params, the study metric per epoch,
timing) with its MLflow runs (run id, tags such as the fail reason, final metric values) into one
pandas DataFrame, one row per trial. `hpolab compare RUN_ID RUN_ID [...]` puts the params and final
metrics of any MLflow runs next to each other, across studies too, and marks what differs.

Formats: `table` (rich, fits the terminal: short param names, 4 significant digits), `markdown`
(the same columns), `csv` and `json` (every column, full float precision, machine-readable).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from hpolab.stores.paths import Stores

RUN_ID = re.compile(r"^[0-9a-f]{32}$")
FAIL_REASON_WIDTH = 48  # characters of the fail reason shown in the table (csv/json have all of it)
# Metrics that are better when larger; anything else sorts ascending (losses, seconds, ...).
HIGHER_IS_BETTER = ("acc", "f1", "auc", "precision", "recall", "score", "samples_per_second", "r2", "iou", "map")


@dataclass
class StudyTable:
    """The trials of one study, plus what is needed to read the table."""

    name: str
    metric: str  # the study metric, e.g. val_acc ("value" when the stores do not say)
    direction: str  # "maximize" | "minimize"
    frame: pd.DataFrame  # one row per trial; see study_frame() for the columns
    params: list[str]  # sampled param names, e.g. ["trainer.lr", "model.channels"]
    mlflow_found: bool  # False when the MLflow side is missing (only Optuna data in the frame)

    @property
    def best_col(self) -> str:
        return f"best_{self.metric}"

    @property
    def final_col(self) -> str:
        return f"final_{self.metric}"


# ---------------------------------------------------------------- study -> DataFrame


def study_metric(study, client, experiment_id: str | None) -> str:
    """The study metric's name: Optuna does not store it; the parent run's params do."""
    parent_id = study.user_attrs.get("mlflow_parent_run_id")
    for run_id in [parent_id] + [t.user_attrs.get("mlflow_run_id") for t in study.get_trials(deepcopy=False)[:3]]:
        if not run_id or client is None:
            continue
        try:
            metric = client.get_run(run_id).data.params.get("metric")
        except Exception:
            continue
        if metric:
            return metric
    return "value"


def mlflow_runs_by_id(client, experiment_id: str | None) -> dict[str, Any]:
    """Every run of the study's experiment, by run id (one paged search, not one query per trial)."""
    if client is None or experiment_id is None:
        return {}
    from hpolab.stores.mlflow_runs import find_runs

    return {r.info.run_id: r for r in find_runs(client, experiment_id, "")}


def _best(values: Iterable[float], direction: str) -> float | None:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return None
    return max(vals) if direction == "maximize" else min(vals)


def _int_or_none(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _float_or_none(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def study_frame(study, client=None, experiment_id: str | None = None, metric: str | None = None) -> StudyTable:
    """One row per trial of an Optuna study, joined with its MLflow run when there is one.

    Columns: trial, state, params.<name> (the sampled values), best_<metric> (best epoch; the
    trial's value for COMPLETE trials), final_<metric> (last epoch), epochs, pruned_at_epoch,
    duration_s, fail_reason, run_id, started, finished, and metrics.<name> for every metric the
    trial's MLflow run logged (its last value).
    """
    direction = study.direction.name.lower()
    metric = metric or study_metric(study, client, experiment_id)
    runs = mlflow_runs_by_id(client, experiment_id)
    trials = study.get_trials(deepcopy=False)
    params = sorted({p for t in trials for p in t.params})
    now = dt.datetime.now()
    rows = []
    for t in trials:
        run_id = t.user_attrs.get("mlflow_run_id")
        run = runs.get(run_id) if run_id else None
        tags = run.data.tags if run is not None else {}
        run_metrics = run.data.metrics if run is not None else {}
        steps = sorted(t.intermediate_values.items())
        best = _float_or_none(tags.get(f"hpolab.best_{metric}")) if t.state.name == "COMPLETE" else None
        if best is None and t.state.name == "COMPLETE" and t.value is not None:
            best = float(t.value)
        if best is None:
            best = _best((v for _, v in steps), direction)
        final = _float_or_none(run_metrics.get(metric))
        if final is None and steps:
            final = float(steps[-1][1])
        epochs = _int_or_none(tags.get("hpolab.epochs_run"))
        if epochs is None:
            epochs = len(steps)
        end = t.datetime_complete or (now if t.state.name == "RUNNING" else None)
        duration = (end - t.datetime_start).total_seconds() if (end and t.datetime_start) else None
        row: dict[str, Any] = {"trial": t.number, "state": t.state.name}
        row.update({f"params.{p}": t.params.get(p) for p in params})
        row.update(
            {
                f"best_{metric}": best,
                f"final_{metric}": final,
                "epochs": epochs,
                "pruned_at_epoch": _int_or_none(tags.get("hpolab.pruned_at_epoch")),
                "duration_s": duration,
                "fail_reason": tags.get("hpolab.fail_reason") or t.user_attrs.get("fail_reason") or t.system_attrs.get("fail_reason"),
                "run_id": run_id,
                "started": t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else None,
                "finished": t.datetime_complete.isoformat(timespec="seconds") if t.datetime_complete else None,
            }
        )
        row.update({f"metrics.{k}": v for k, v in sorted(run_metrics.items())})
        rows.append(row)
    base = ["trial", "state", *[f"params.{p}" for p in params], f"best_{metric}", f"final_{metric}", "epochs",
            "pruned_at_epoch", "duration_s", "fail_reason", "run_id", "started", "finished"]
    frame = pd.DataFrame(rows)
    if frame.empty:
        frame = pd.DataFrame(columns=base)
    extra = sorted(c for c in frame.columns if c not in base)
    frame = frame[base + extra]
    # Integer columns with gaps (RUNNING trials, no MLflow run) stay integers, not floats.
    for col in ("trial", "epochs", "pruned_at_epoch"):
        frame[col] = frame[col].astype("Int64")
    return StudyTable(study.study_name, metric, direction, frame, params, bool(runs))


def load_study_table(name: str, stores: Stores) -> StudyTable:
    from hpolab.stores.optuna_storage import load_study

    study = load_study(name, stores)
    client, experiment_id = None, None
    try:
        client = tracking_client(stores)
        exp = client.get_experiment_by_name(name) if client is not None else None
        experiment_id = exp.experiment_id if client is not None and exp is not None else None
    except Exception:
        client = None  # the MLflow store is unreachable: Optuna's side alone still makes a table
    return study_frame(study, client, experiment_id)


def tracking_client(stores: Stores):
    """An MlflowClient, or None when the local MLflow database does not exist (reading must not create it)."""
    from hpolab.stores.mlflow_runs import client_for

    uri = stores.tracking_uri
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return None
    return client_for(stores)


# ---------------------------------------------------------------- filter / sort / top


def resolve_column(frame: pd.DataFrame, key: str) -> str:
    """A column from what a user types: exact, or params.<key>, metrics.<key>, or a unique suffix."""
    from hpolab.errors import UserError

    for candidate in (key, f"params.{key}", f"metrics.{key}"):
        if candidate in frame.columns:
            return candidate
    suffix = [c for c in frame.columns if c.endswith("." + key)]
    if len(suffix) == 1:
        return suffix[0]
    known = ", ".join(c for c in frame.columns if c not in ("state", "fail_reason", "run_id", "started", "finished"))
    if len(suffix) > 1:
        raise UserError(f"--sort {key} is ambiguous ({', '.join(suffix)}); give the full column name")
    raise UserError(f"--sort {key}: no such column; use one of: {known}")


def _descending(table: StudyTable, col: str) -> bool:
    if col in (table.best_col, table.final_col, f"metrics.{table.metric}"):
        return table.direction == "maximize"
    name = col.rsplit(".", 1)[-1].lower()
    return any(h in name for h in HIGHER_IS_BETTER)


def select(table: StudyTable, state: str = "all", sort: str | None = None, top: int | None = None) -> pd.DataFrame:
    """Filter by state, sort best first (the study metric by default), keep the top K rows."""
    from hpolab.errors import UserError

    df = table.frame
    if state != "all":
        df = df[df["state"] == state.upper()]
    if top is not None and top < 1:
        raise UserError(f"--top must be >= 1, got {top}")
    descending = None
    key = sort
    if sort and ":" in sort:
        key, order = sort.rsplit(":", 1)
        if order not in ("asc", "desc"):
            raise UserError(f"--sort {sort}: write METRIC, METRIC:asc or METRIC:desc")
        descending = order == "desc"
    col = resolve_column(df, key) if key else table.best_col
    if descending is None:
        descending = _descending(table, col)
    # Missing values (FAIL trials, RUNNING ones) go last; ties keep trial order.
    df = df.sort_values([col, "trial"], ascending=[not descending, True], na_position="last", kind="stable")
    if top is not None:
        df = df.head(top)
    return df.reset_index(drop=True)


# ---------------------------------------------------------------- output


def json_value(v: Any) -> Any:
    """A pandas/numpy cell as plain JSON data (NaN/NA -> None); the report uses it too."""
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float):
        return None if math.isnan(v) else v
    if hasattr(v, "item"):  # numpy / pandas scalars
        return json_value(v.item())
    return v


def to_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: json_value(v) for k, v in zip(df.columns, row)} for row in df.itertuples(index=False, name=None)]


def fmt_cell(v: Any) -> str:
    v = json_value(v)
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def short_names(names: list[str]) -> dict[str, str]:
    """`trainer.lr` -> `lr`, unless two params end the same way (then more of the path is kept)."""
    out = {}
    for name in names:
        parts = name.split(".")
        for k in range(1, len(parts) + 1):
            short = ".".join(parts[-k:])
            if sum(1 for other in names if other == short or other.endswith("." + short)) == 1:
                break
        out[name] = short
    return out


def display_columns(table: StudyTable, df: pd.DataFrame) -> list[tuple[str, str]]:
    """(column, header) pairs for the human formats: the issue's columns, short param names."""
    shorts = short_names(table.params)
    cols = [("trial", "trial"), ("state", "state")]
    cols += [(f"params.{p}", shorts[p]) for p in table.params]
    cols += [(table.best_col, f"best {table.metric}"), (table.final_col, f"final {table.metric}"), ("epochs", "epochs")]
    if df["pruned_at_epoch"].notna().any():
        cols.append(("pruned_at_epoch", "pruned at"))
    cols += [("duration_s", "seconds")]
    if df["fail_reason"].notna().any():
        cols.append(("fail_reason", "fail reason"))
    cols.append(("run_id", "run id"))
    return cols


def _cell(col: str, v: Any, width: int | None = None) -> str:
    s = fmt_cell(v)
    if col == "duration_s" and s != "-":
        s = f"{float(v):.1f}"
    if width and len(s) > width:
        s = s[: width - 1] + "…"
    return s


def render_markdown(headers: list[str], rows: list[list[str]], right: list[bool] | None = None) -> str:
    """A GitHub-flavoured markdown table (no tabulate dependency)."""

    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    right = right or [False] * len(headers)
    lines = ["| " + " | ".join(esc(h) for h in headers) + " |"]
    lines.append("|" + "|".join("---:" if r else "---" for r in right) + "|")
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _console(out=None):
    from rich.console import Console

    # Not a terminal (a pipe, a test): rich uses $COLUMNS, else 80 columns.
    return Console(file=None if out in (None, sys.stdout) else out, highlight=False, soft_wrap=False)


def _wrap_header(header: str, width: int) -> str:
    """Break a header onto lines at spaces, '_' or '.' so that it is no wider than its values."""
    parts = re.findall(r"[^ _.]+(?:[_.]|\s|$)", header)
    lines, line = [], ""
    for p in parts:
        if line and len(line + p.rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        line += p
    lines.append(line.rstrip())
    return "\n".join(lines)


def fit_table(console, table: StudyTable, df: pd.DataFrame, cols: list[tuple[str, str]], numeric: set[str], state: str):
    """A rich table that fits console.width without cutting a value: long headers wrap; then the
    fail reason is truncated, run ids shortened to 8 characters, and columns left out (with a note)."""
    from rich import box
    from rich.table import Table

    title = f"study {table.name}: {table.metric} ({table.direction})" + (f", {state} trials" if state != "all" else "")
    style = {"COMPLETE": None, "PRUNED": "yellow", "FAIL": "red", "RUNNING": "cyan"}
    cells = {c: [_cell(c, v) for v in df[c]] for c, _ in cols}
    reasons = cells.pop("fail_reason", None)
    full_ids = cells["run_id"]

    def build(cols, cells):
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
        for col, header in cols:
            value_w = max([len(v) for v in cells[col]], default=0)
            # Wrap at spaces; split a long name at '_' or '.' only when that saves real width.
            word = max(len(w) for w in header.split())
            target = max(value_w, word if word <= value_w + 2 else max(len(w) for w in _re_words(header)))
            head = _wrap_header(header, target)
            width = max([value_w, *(len(line) for line in head.splitlines())])
            t.add_column(head, justify="right" if col in numeric else "left", no_wrap=True, min_width=width)
        for i, st in enumerate(df["state"]):
            t.add_row(*[cells[c][i] for c, _ in cols], style=style.get(st))
        return t

    def natural_width(t) -> int:
        # Measured against a very wide console: rich clamps a measurement to the width it is given.
        return console.measure(t, options=console.options.update_width(100_000)).maximum

    def fits(t) -> bool:
        return natural_width(t) <= console.width

    def layout(short_ids: bool, drop: tuple[str, ...], with_reason: bool):
        cells["run_id"] = [s[:8] for s in full_ids] if short_ids else full_ids
        shown = [c for c in cols if c[0] != "fail_reason" and c[0] not in drop]
        t = build(shown, cells)
        if with_reason and reasons is not None:
            room = console.width - natural_width(t) - 2
            if room < 20:
                return None
            cells["fail_reason"] = [_cell("fail_reason", s, min(room, FAIL_REASON_WIDTH)) for s in reasons]
            shown = [c for c in cols if c[0] not in drop]
            t = build(shown, cells)
        return (t, shown) if fits(t) else None

    # Plans in order of preference; the first that fits wins (the last one fits or gets squeezed).
    optional = ("pruned_at_epoch", "duration_s")
    plans = [(False, (), True), (True, (), True)]
    if state == "fail":  # the reason is the point of this view: give up timing columns for it
        plans.append((True, optional, True))
    plans += [(True, (), False), (True, optional[:1], False), (True, optional, False),
              (True, (*optional, "run_id"), False), (True, (*optional, "run_id", table.final_col), False)]
    for plan in plans:
        fitted = layout(*plan)
        if fitted:
            break
    else:
        shown = [c for c in cols if c[0] != "fail_reason" and c[0] not in plans[-1][1]]
        fitted = (build(shown, cells), shown)  # still too wide: rich squeezes it
    t, shown = fitted
    notes: list[str] = []
    missing = [c for c, _ in cols if c not in {c for c, _ in shown}]
    if missing:
        notes.append(f"left out to fit the terminal: {', '.join(missing)} (--format csv or json has every column)")
    if any(c == "run_id" for c, _ in shown) and cells["run_id"] != full_ids:
        notes.append("run ids shortened to fit the terminal (--format csv or json has them in full)")
    return t, notes


def _re_words(header: str) -> list[str]:
    return [w for w in re.split(r"[ _.]", header) if w] or [header]


def _write_machine_readable(df: pd.DataFrame, fmt: str, out) -> bool:
    """csv/json: every column, full precision. False for the human formats."""
    if fmt == "csv":
        df.to_csv(out, index=False)
    elif fmt == "json":
        out.write(json.dumps(to_records(df), indent=1) + "\n")
    else:
        return False
    return True


def print_study(table: StudyTable, df: pd.DataFrame, fmt: str, state: str, out=None) -> None:
    out = out or sys.stdout
    if _write_machine_readable(df, fmt, out):
        return
    cols = display_columns(table, df)
    numeric = {c for c, _ in cols if c not in ("state", "fail_reason", "run_id")}
    if fmt == "markdown":
        rows = [[_cell(c, r[c]) for c, _ in cols] for _, r in df.iterrows()]
        out.write(render_markdown([h for _, h in cols], rows, [c in numeric for c, _ in cols]))
        return
    console = _console(out)
    t, notes = fit_table(console, table, df, cols, numeric, state)
    console.print(t)
    if df.empty:
        console.print(f"no {state} trials" if state != "all" else "the study has no trials yet")
    if not table.mlflow_found and not table.frame.empty:
        console.print(f"note: no MLflow runs found for experiment {table.name!r}; run ids, fail reasons and metrics are missing")
    for note in notes:
        console.print(f"note: {note}")


# ---------------------------------------------------------------- runs side by side


def runs_frame(client, run_ids: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """Rows: run facts, then params, then final metrics; one column per run, and `differs`."""
    from mlflow.exceptions import MlflowException

    from hpolab.errors import UserError

    runs = []
    for rid in run_ids:
        try:
            runs.append(client.get_run(rid))
        except MlflowException:
            raise UserError(f"no MLflow run {rid} in this tracking store") from None
    exp_names: dict[str, str] = {}
    for r in runs:
        eid = r.info.experiment_id
        if eid not in exp_names:
            try:
                exp_names[eid] = client.get_experiment(eid).name
            except MlflowException:
                exp_names[eid] = eid
    labels = []
    for r in runs:
        label = f"{exp_names[r.info.experiment_id]}/{r.info.run_name or r.info.run_id[:8]}"
        labels.append(label if label not in labels else f"{label} ({r.info.run_id[:8]})")

    def facts(r) -> dict[str, Any]:
        t = r.data.tags
        return {
            "run id": r.info.run_id,
            "study": exp_names[r.info.experiment_id],
            "run name": r.info.run_name,
            "state": t.get("hpolab.state", r.info.status),
            "epochs": t.get("hpolab.epochs_run"),
            "fail reason": t.get("hpolab.fail_reason"),
        }

    rows: list[dict[str, Any]] = []

    def add(section: str, key: str, values: list[Any]) -> None:
        present = [v for v in values if v is not None]
        differs = len({json.dumps(json_value(v), sort_keys=True, default=str) for v in values}) > 1
        if section == "run" and key == "run id":
            differs = False  # always different; not a finding
        if not present and section == "run":
            return
        rows.append({"section": section, "key": key, **dict(zip(labels, values)), "differs": differs})

    all_facts = [facts(r) for r in runs]
    for key in all_facts[0]:
        add("run", key, [f[key] for f in all_facts])
    for key in sorted({k for r in runs for k in r.data.params}):
        add("param", key, [r.data.params.get(key) for r in runs])
    for key in sorted({k for r in runs for k in r.data.metrics}):
        add("metric", key, [r.data.metrics.get(key) for r in runs])
    return pd.DataFrame(rows, columns=["section", "key", *labels, "differs"]), labels


def print_runs(df: pd.DataFrame, labels: list[str], fmt: str, out=None) -> None:
    out = out or sys.stdout
    if _write_machine_readable(df, fmt, out):
        return
    # Human formats: the run facts, then the params that differ (highlighted), then the ones that
    # are the same, then the final metrics (not highlighted: metrics of different runs always differ).
    order = {"run": 0, "param": 1, "metric": 2}
    mark = df["differs"] & (df["section"] != "metric")
    df = df.assign(_o=df["section"].map(order), _d=~(mark & (df["section"] == "param")), _mark=mark)
    df = df.sort_values(["_o", "_d"], kind="stable")
    if fmt == "markdown":
        rows = [[("**≠** " if r["_mark"] else "") + f"{r['section']} `{r['key']}`", *[fmt_cell(r[lab]) for lab in labels]]
                for _, r in df.iterrows()]
        out.write(render_markdown(["", *labels], rows))
        return
    from rich.table import Table

    n_diff = int(df.loc[df["section"] == "param", "differs"].sum())
    t = Table(title=f"{len(labels)} runs: {n_diff} param(s) differ (marked ≠, highlighted)", title_justify="left")
    t.add_column("", no_wrap=True)
    t.add_column("key", overflow="fold")
    for lab in labels:
        t.add_column(lab, overflow="fold")
    prev = None
    for _, r in df.iterrows():
        if prev is not None and r["section"] != prev:
            t.add_section()
        prev = r["section"]
        style = "bold yellow" if r["_mark"] else ("dim" if r["section"] == "param" else None)
        t.add_row("≠" if r["_mark"] else "", f"{r['section']}: {r['key']}", *[fmt_cell(r[lab]) for lab in labels], style=style)
    _console(out).print(t)


# ---------------------------------------------------------------- command


def compare_cmd(args, stores: Stores) -> int:
    from hpolab.errors import UserError

    targets = list(args.targets)
    ids = [t for t in targets if RUN_ID.match(t)]
    if len(targets) == 1 and not ids:
        table = load_study_table(targets[0], stores)
        df = select(table, state=args.state, sort=args.sort, top=args.top)
        print_study(table, df, args.format, args.state)
        return 0
    if len(targets) == 1:
        raise UserError(f"{targets[0]} looks like a run id: give two or more run ids to compare runs, or a study name")
    if len(ids) != len(targets):
        bad = ", ".join(t for t in targets if t not in ids)
        raise UserError(f"not MLflow run ids (32 hex characters): {bad}. Give one study name, or two or more run ids")
    if args.top is not None or args.sort:
        raise UserError("--top and --sort apply to a study's trials (hpolab compare NAME), not to run ids")
    if args.state != "all":
        raise UserError("--state applies to a study's trials (hpolab compare NAME), not to run ids")
    from hpolab.stores.mlflow_runs import client_for

    df, labels = runs_frame(client_for(stores), targets)
    print_runs(df, labels, args.format)
    return 0
