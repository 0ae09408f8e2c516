"""How `hpolab compare` prints a study's table: `table` (rich, fits the terminal: short param names,
4 significant digits), `markdown` (the same columns), `csv` and `json` (every column, full float
precision, machine-readable).
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

import pandas as pd

from hpolab.analysis.compare.study import StudyTable

FAIL_REASON_WIDTH = 48  # characters of the fail reason shown in the table (csv/json have all of it)


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
    if table.objectives:  # several objectives: where each trial stands, and every objective
        cols += [("rank", "rank"), ("front", "front")] + [(f"objective.{n}", n) for n in table.objectives]
    cols += [(f"params.{p}", shorts[p]) for p in table.params]
    cols += [(table.best_col, f"best {table.metric}"), (table.final_col, f"final {table.metric}")]
    cols += [(c, c.replace("_", " ")) for c in ("tied", "noise_probe") if c in df.columns]  # (a measured noise floor; a noise probe)
    cols += [("epochs", "epochs")]
    if df["pruned_at_epoch"].notna().any():
        cols.append(("pruned_at_epoch", "pruned at"))
    cols += [("duration_s", "seconds")] + resource_columns(df)
    if df["fail_reason"].notna().any():
        cols.append(("fail_reason", "fail reason"))
    cols.append(("run_id", "run id"))
    if df["model_id"].notna().any():  # the trial's logged model (csv/json: its name and models:/ URI too)
        cols.append(("model_id", "model"))
    return cols


# What a trial used (its run's system metrics, trials/system_metrics.py; the routine's throughput), when recorded
RESOURCES = (("metrics.system/peak_memory_megabytes", "peak MB"), ("metrics.system/peak_gpu_0_memory_megabytes", "peak GPU MB"),
             ("metrics.samples_per_second", "samples/s"))


def resource_columns(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(column, header) of the RESOURCES some trial has a value of."""
    return [(c, h) for c, h in RESOURCES if c in df.columns and df[c].notna().any()]


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


def console_for(out=None):
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


STATE_STYLE = {"COMPLETE": None, "PRUNED": "yellow", "FAIL": "red", "RUNNING": "cyan", "PAUSED": "cyan"}


def _rich_table(title: str, states, cols: list[tuple[str, str]], cells: dict[str, list[str]], numeric: set[str]):
    """The rich table of these columns: each as wide as its widest value, headers wrapped to fit."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for col, header in cols:
        value_w = max([len(v) for v in cells[col]], default=0)
        # Wrap at spaces; split a long name at '_' or '.' only when that saves real width.
        word = max(len(w) for w in header.split())
        target = max(value_w, word if word <= value_w + 2 else max(len(w) for w in _re_words(header)))
        head = _wrap_header(header, target)
        width = max([value_w, *(len(line) for line in head.splitlines())])
        t.add_column(head, justify="right" if col in numeric else "left", no_wrap=True, min_width=width)
    for i, st in enumerate(states):
        t.add_row(*[cells[c][i] for c, _ in cols], style=STATE_STYLE.get(st))
    return t


def _fit_plans(state: str, final_col: str) -> list[tuple[bool, tuple[str, ...], bool]]:
    """(short run ids, columns left out, with the fail reason), in order of preference."""
    optional = ("pruned_at_epoch", *(c for c, _ in RESOURCES), "duration_s")
    plans = [(False, (), True), (True, (), True)]
    if state == "fail":  # the reason is the point of this view: give up timing columns for it
        plans.append((True, optional, True))
    ids = (*optional, "model_id", "run_id")
    plans += [(True, (), False), (True, optional[:1], False), (True, optional, False), (True, (*optional, "model_id"), False),
              (True, ids, False), (True, (*ids, final_col), False)]
    return plans


def fit_table(console, table: StudyTable, df: pd.DataFrame, cols: list[tuple[str, str]], numeric: set[str], state: str):
    """A rich table that fits console.width without cutting a value: long headers wrap; then the
    fail reason is truncated, run ids shortened to 8 characters (model ids to m- and 8), and columns
    left out (with a note)."""
    title = f"study {table.name}: {table.metric} ({table.direction})" + (f", {state} trials" if state != "all" else "")
    cells = {c: [_cell(c, v) for v in df[c]] for c, _ in cols}
    reasons = cells.pop("fail_reason", None)
    full_ids = cells["run_id"]
    full_models = cells.get("model_id")

    def build(cols, cells):
        return _rich_table(title, df["state"], cols, cells, numeric)

    def natural_width(t) -> int:
        # Measured against a very wide console: rich clamps a measurement to the width it is given.
        return console.measure(t, options=console.options.update_width(100_000)).maximum

    def layout(short_ids: bool, drop: tuple[str, ...], with_reason: bool):
        cells["run_id"] = [s[:8] for s in full_ids] if short_ids else full_ids
        if full_models is not None:
            cells["model_id"] = [s[:10] for s in full_models] if short_ids else full_models
        shown = [c for c in cols if c[0] != "fail_reason" and c[0] not in drop]
        t = build(shown, cells)
        if with_reason and reasons is not None:
            room = console.width - natural_width(t) - 2
            if room < 20:
                return None
            cells["fail_reason"] = [_cell("fail_reason", s, min(room, FAIL_REASON_WIDTH)) for s in reasons]
            shown = [c for c in cols if c[0] not in drop]
            t = build(shown, cells)
        return (t, shown) if natural_width(t) <= console.width else None

    # The first plan that fits wins (the last one fits or gets squeezed).
    plans = _fit_plans(state, table.final_col)
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
    full = {"run_id": ("run", full_ids), "model_id": ("model", full_models)}
    short = [full[c][0] for c, _ in shown if c in full and cells[c] != full[c][1]]
    if short:
        notes.append(f"{' and '.join(short)} ids shortened to fit the terminal (--format csv or json has them in full)")
    return t, notes


def _re_words(header: str) -> list[str]:
    return [w for w in re.split(r"[ _.]", header) if w] or [header]


def write_machine_readable(df: pd.DataFrame, fmt: str, out) -> bool:
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
    if write_machine_readable(df, fmt, out):
        return
    cols = display_columns(table, df)
    numeric = {c for c, _ in cols if c not in ("state", "fail_reason", "run_id", "model_id")}
    if fmt == "markdown":
        rows = [[_cell(c, r[c]) for c, _ in cols] for _, r in df.iterrows()]
        out.write(render_markdown([h for _, h in cols], rows, [c in numeric for c, _ in cols]))
        return
    console = console_for(out)
    t, notes = fit_table(console, table, df, cols, numeric, state)
    console.print(t)
    if df.empty:
        console.print(f"no {state} trials" if state != "all" else "the study has no trials yet")
    if not table.mlflow_found and not table.frame.empty:
        console.print(f"note: no MLflow runs found for experiment {table.name!r}; run ids, fail reasons and metrics are missing")
    for note in notes:
        console.print(f"note: {note}")
    if table.noise_floor is not None and "tied" in table.frame.columns:
        n = int((table.frame["tied"] == "yes").sum())
        console.print(f"noise floor {table.noise_floor:.4g} (sd of {table.metric} over training seeds): {n} trial{'s' * (n != 1)} "
                      "within it of the best, marked tied")
