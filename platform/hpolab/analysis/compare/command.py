"""`hpolab compare`: the trials of a study as one table, or any runs side by side.

`hpolab compare NAME` joins the Optuna study (state, sampled params, the study metric per epoch,
timing) with its MLflow runs (run id, tags such as the fail reason, final metric values) into one
pandas DataFrame, one row per trial. `hpolab compare RUN_ID RUN_ID [...]` puts the params and final
metrics of any MLflow runs next to each other, across studies too, and marks what differs.

Formats: `table` (rich, fits the terminal: short param names, 4 significant digits), `markdown`
(the same columns), `csv` and `json` (every column, full float precision, machine-readable).

Reading a study's trials is compare_study.py (compare_sql.py for an embedded store), printing them
compare_render.py, runs side by side compare_runs.py; this module is the command.
"""

from __future__ import annotations

import re

# The names below were all defined here before the split; they stay importable from here.
from hpolab.analysis.compare.render import fmt_cell, json_value, print_study, short_names, to_records  # noqa: F401
from hpolab.analysis.compare.rest import rest_study_table
from hpolab.analysis.compare.runs import print_runs, runs_frame
from hpolab.analysis.compare.sql import sql_study_table
from hpolab.analysis.compare.study import StudyTable, load_study_table, select, study_frame, study_metric, tracking_client  # noqa: F401
from hpolab.stores.paths import Stores

RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def study_rows(name: str, stores: Stores, state: str = "all", sort: str | None = None, top: int | None = None):
    """(StudyTable, its rows as `compare NAME` shows them): filtered by state, sorted best first, cut to
    the top K. --top K by the study metric: only the K shown trials' runs are read; an embedded store
    with plain SQL, an MLflow server over its REST API (compare/rest.py), without importing MLflow. (hpolab.load_study(...).trials_df() is these rows.)"""
    top_k = (state, top) if top and not sort else None
    table = sql_study_table(name, stores, top_k) or rest_study_table(name, stores, top_k) or load_study_table(name, stores, top=top_k)
    return table, select(table, state=state, sort=sort, top=top)


def compare_cmd(args, stores: Stores) -> int:
    from hpolab.errors import UserError

    targets = list(args.targets)
    ids = [t for t in targets if RUN_ID.match(t)]
    if len(targets) == 1 and not ids:
        table, df = study_rows(targets[0], stores, state=args.state, sort=args.sort, top=args.top)
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
