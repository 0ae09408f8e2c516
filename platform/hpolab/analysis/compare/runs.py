"""`hpolab compare RUN_ID RUN_ID [...]`: the params and final metrics of any MLflow runs next to
each other, across studies too, with what differs marked.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pandas as pd

from hpolab.analysis.compare.render import console_for, fmt_cell, json_value, render_markdown, write_machine_readable


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
    if write_machine_readable(df, fmt, out):
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
    console_for(out).print(t)
