"""`hpolab.load_study(...)` and the Study it returns: a study in its stores, read on demand.

Every method is a command's own code (one code path with the CLI): `trials_df` is `hpolab compare
NAME`'s table, `best` its first COMPLETE row, `front` the Pareto front as study/objectives/ranking.py
computes it, `check` `hpolab study check`, `report` `hpolab report`, `promote` `hpolab promote`.
A Study holds no connection: each call opens the stores it names and reads what is there now.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hpolab.api.specs as specs
from hpolab.api.stores import keep_tracking_uri, open_stores
from hpolab.errors import EXIT_OK, EXIT_REFUSED

STATES = ("complete", "pruned", "fail", "all")  # what trials_df(state=...) filters by


@dataclass(frozen=True)
class BestTrial:
    """The best COMPLETE trial, as `hpolab compare NAME` ranks it (its first COMPLETE row)."""

    number: int
    metric: str  # the study metric (several objectives: the one pruned on)
    value: float | None  # its best epoch's value of `metric` (the trial's Optuna value)
    values: dict[str, float | None]  # every objective's value (one objective: {metric: value})
    params: dict[str, Any]  # the sampled values, by search_space path ("trainer.lr")
    run_id: str | None  # its MLflow run
    model_uri: str | None  # its logged model (models:/m-...), None when it has none (retention)


class Study:
    """A study in its stores. Made by `hpolab.run_study` and `hpolab.load_study`."""

    def __init__(self, name: str, stores, spec=None, outcome=None):
        self.name = name
        self.stores = stores  # hpolab.stores.paths.Stores: where it lives
        self.spec = spec  # the StudySpec run_study ran (None when loaded by name)
        self.outcome = outcome  # the driver's Outcome of run_study (None when loaded)

    def __repr__(self) -> str:
        return f"Study({self.name!r}, store={str(self.stores.root)!r})"

    def _table(self, state: str = "all", sort: str | None = None, top: int | None = None):
        from hpolab.analysis.compare.command import study_rows
        from hpolab.errors import UserError

        if state not in STATES:  # (the CLI's --state choices)
            raise UserError(f"state={state!r}: use one of {', '.join(STATES)}")
        with keep_tracking_uri():
            return study_rows(self.name, self.stores, state=state, sort=sort, top=top)

    def trials_df(self, state: str = "all", sort: str | None = None, top: int | None = None):
        """One row per trial, best first: the columns and values of `hpolab compare NAME --format csv`
        (trial, state, params.*, best_<metric>, final_<metric>, epochs, ..., run_id, model_uri, metrics.*;
        several objectives add rank, front and objective.*). `state`: complete | pruned | fail | all;
        `sort`: a column, metric or param (METRIC:asc|desc forces the order); `top`: the K first rows."""
        return self._table(state, sort, top)[1]

    @property
    def best(self) -> BestTrial | None:
        """The best COMPLETE trial as `compare` ranks it (several objectives: Pareto rank 1, feasible
        first); None while no trial has completed."""
        table, df = self._table(state="complete", top=1)
        if df.empty:
            return None
        row = df.iloc[0]
        objectives = {n: _plain(row.get(f"objective.{n}")) for n in table.objectives}
        value = _plain(row[table.best_col])
        return BestTrial(number=int(row["trial"]), metric=table.metric, value=value,
                         values=objectives or {table.metric: value},
                         params={p: _plain(row[f"params.{p}"]) for p in table.params},
                         run_id=_plain(row["run_id"]), model_uri=_uri(_plain(row["model_uri"]), self.stores))

    def front(self):
        """Several objectives: the Pareto front's rows of trials_df() (feasible COMPLETE trials no
        other dominates, as study/objectives/ranking.py decides), in compare's order."""
        from hpolab.errors import UserError
        from hpolab.stores.optuna_storage import load_study
        from hpolab.study.objectives import ranking

        optuna_study = load_study(self.name, self.stores)
        if len(optuna_study.directions) < 2:
            raise UserError(f"study {self.name!r} has one objective: it has a best trial (Study.best), not a front")
        on_front = {t.number for t in ranking.front(optuna_study.get_trials(deepcopy=False), ranking.directions_of(optuna_study))}
        df = self.trials_df()
        return df[df["trial"].isin(on_front)].reset_index(drop=True)

    def check(self, repair: bool = False) -> list:
        """`hpolab study check`: the disagreements between the study's Optuna trials and MLflow runs
        that remain (empty: the stores agree). Each has .trial, .what and .fix; `repair` first fixes
        what can be fixed without deleting anything (as --repair). Prints what the command prints
        besides its table: the `repaired` lines, and a trial left claimed by a stopped driver."""
        from hpolab.analysis.check import outcome_lines, run_check

        with keep_tracking_uri():
            result = run_check(self.name, self.stores, repair=repair)
        for line in outcome_lines(result):
            print(line)
        return result.remaining

    def report(self, path: str | Path | None = None, ui_url: str | None = None) -> Path:
        """`hpolab report`: write the self-contained HTML report (default STORE/reports/NAME.html), log
        it to the study's parent run, print where; returns the file's path."""
        from hpolab.analysis.report.command import report_and_log

        with keep_tracking_uri():
            return report_and_log(self.name, self.stores, Path(path) if path is not None else None, ui_url)

    def pause(self):
        """`hpolab study pause NAME`: every live worker starts no new trial and resumes no paused one
        (running trials go on), within seconds. Returns the control record written (.version, .state, ...)."""
        return self._steer("pause")

    def resume(self):
        """`hpolab study resume NAME`: a paused study's workers start trials again; a stopped study may run again."""
        return self._steer("resume")

    def stop(self, now: bool = False):
        """`hpolab study stop NAME [--now]`: every live worker starts nothing new; its running trials finish
        (`now`: stop after their current epoch, resumable), then it ends (`study run` exits 0)."""
        return self._steer("stop", now=now)

    def set(self, values: dict[str, Any] | None = None, **controls: Any):
        """`hpolab study set NAME key=value ...`: change run controls on every live worker, e.g.
        `study.set(n_trials=60, parallel=1, timeout="2h")` or `study.set({"budget.epochs": 400})`.
        Checked as overrides are (SpecError names the field)."""
        return self._steer("set", specs.override_strings({**(values or {}), **controls}))

    def _steer(self, kind: str, items: list[str] | None = None, now: bool = False):
        from hpolab.tools.study_control import change_study

        return change_study(self.name, self.stores, kind, items, now)

    def promote(self, *, metric: str | None = None, pick: str | None = None, model_name: str | None = None,
                alias: str = "champion", force: bool = False, dry_run: bool = False, race: bool = True,
                race_top: int | None = None, race_seeds: int | None = None) -> "Promotion":
        """`hpolab promote`: the best trial's model through the held-out test gate into the registry
        (the same options and printed lines as the command). `race=False`, `race_top`, `race_seeds`:
        --no-race, --race-top, --race-seeds (None: the spec's `promotion:`, 3 and 5 by default): the
        race retrains the leaders on fresh seeds in trial processes before the gate; Ctrl-C during it
        raises KeyboardInterrupt, and promote() again resumes it.

        Returns the Promotion decided: `.refused` when the gate kept the alias holder (the command's
        exit code 3; nothing written), else `.promoted` (or a dry run); `.version` holds the alias
        afterwards. Raises UserError for bad arguments or a study it cannot promote from, and
        hpolab.registry.evaluation.PromotionFailed (exit 1) when an export or its parity check fails."""
        from hpolab.registry.champion import alias_holder
        from hpolab.registry.promote import promote_study
        from hpolab.registry.race_rounds import RaceInterrupted
        from hpolab.stores.mlflow_runs import client_for

        with keep_tracking_uri():
            try:
                code = promote_study(self.name, self.stores, metric=metric, pick=pick, model_name=model_name,
                                     alias=alias, force=force, dry_run=dry_run, race=race, race_top=race_top, race_seeds=race_seeds)
            except RaceInterrupted as e:
                raise KeyboardInterrupt(str(e)) from None
            holder = alias_holder(client_for(self.stores), model_name or self.name, alias)
        return Promotion(code, model_name or self.name, alias, int(holder.version) if holder is not None else None, dry_run,
                         self.stores)


@dataclass(frozen=True)
class Promotion:
    """What Study.promote decided."""

    exit_code: int  # `hpolab promote`'s: 0 promoted (or already the holder), 3 refused by the gate
    model_name: str  # the registered model
    alias: str
    version: int | None  # the version holding the alias now (None: no version holds it)
    dry_run: bool
    stores: Any = None  # hpolab.stores.paths.Stores: where it is registered (the study's)

    @property
    def refused(self) -> bool:
        return self.exit_code == EXIT_REFUSED

    @property
    def promoted(self) -> bool:
        """The alias holds the challenger now (it moved, or the challenger held it already)."""
        return self.exit_code == EXIT_OK and not self.dry_run

    @property
    def model_uri(self) -> str:
        """models:/NAME@ALIAS, carrying the study's stores: hpolab.predict(promotion.model_uri, x) reads them."""
        return _uri(f"models:/{self.model_name}@{self.alias}", self.stores)

    def predict(self, inputs: Any):
        """hpolab.predict(self.model_uri, inputs): the champion's predictions, from the study's stores."""
        from hpolab.api.models import predict

        return predict(self.model_uri, inputs)


def _uri(uri: str | None, stores) -> str | None:
    from hpolab.api.models import ModelUri

    return ModelUri(uri, stores) if uri is not None and stores is not None else uri


def _plain(v: Any) -> Any:
    """A DataFrame cell as a plain Python value (None for missing)."""
    import pandas as pd

    if v is None or (not isinstance(v, (list, dict)) and pd.isna(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def load_study(name_or_spec: specs.SpecSource, *, store: str | Path | None = None, storage: str | None = None,
               tracking_uri: str | None = None) -> Study:
    """The study `name_or_spec` names (a study name, a spec file whose `name:` is used, or a spec
    dict) in the stores given (as the CLI's --store / --storage / --tracking-uri: default the
    environment, then ./mlruns). Raises UserError when the stores hold no such study."""
    from hpolab.stores.optuna_storage import load_study as load_optuna_study

    name = specs.study_name(name_or_spec)
    stores = open_stores(store, storage, tracking_uri, tracking=False, create=False)
    load_optuna_study(name, stores)  # (UserError naming the studies there when it is not one of them)
    return Study(name, stores)

