"""Terminal progress of a study: one line per trial event, a live status line, a summary table."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from hpolab.stores.trial_counts import ASIDE_TEXT, count_trials, describe, epochs_used, over_budget_note, paused_counts
from hpolab.stores.trial_states import is_imported, last_pause, shown
from hpolab.study.objectives import ranking


class Progress:
    def __init__(self, spec, console: Console | None = None, quiet: bool = False, trial_output: bool = True,
                 started: float | None = None, summary: bool = True):
        self.spec = spec
        self.console = console or _console()
        self.quiet = quiet
        self.trial_output = trial_output  # print what trials print, as `trial N | line` (study/trials/trial_output.py)
        self.summary = summary  # the table at the end (a promotion race prints its own)
        self.best: float | None = None
        self.epochs: dict[int, int] = {}
        self.t0 = time.monotonic() if started is None else started  # the command's start: what "elapsed" counts
        self.bar = None  # in Jupyter: a bar of finished trials, updated in place (notebook_bar.py)
        self.listeners: list = []  # called with (number, state, reason, trial, output) at each trial's end (the notifications: notify.py)

    def _print(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text)

    def begin(self, counts: dict[str, int], stores) -> None:
        self.stores = stores  # (the end's hints name them)
        if self.console.is_jupyter and not self.quiet:
            from hpolab.study.driver.notebook_bar import NotebookBar

            self.bar = NotebookBar(self.spec.name, self.spec.n_trials)
            self.bar.update(counts["finished"], "")
        self._print(
            f"[bold]study {self.spec.name}[/]: {counts['finished']}/{self.spec.n_trials} trials finished so far; "
            f"{self._goal()}; {self.spec.parallel} at a time\n"
            f"  {stores.describe().replace(chr(10), chr(10) + '  ')}"
        )

    def _goal(self) -> str:
        if not self.spec.is_multi_objective:
            return f"metric {self.spec.metric} ({self.spec.direction})"
        names = ", ".join(f"{o.metric} ({o.direction})" for o in self.spec.objective_list)
        return f"objectives {names}, pruning on {self.spec.metric}"

    def note(self, text: str) -> None:
        self._print(f"[yellow]{escape(text)}[/]")  # reasons may hold [brackets]: never markup

    def trial_line(self, number: int, line: str) -> None:
        """A line a trial process printed (its colours kept)."""
        if self.trial_output and not self.quiet:
            self.console.print(Text.assemble((f"trial {number} | ", "dim"), Text.from_ansi(line)), soft_wrap=True)

    def trial_started(self, number: int, params: dict[str, Any], retry_of: int | None) -> None:
        self.epochs[number] = 0
        shown = escape(", ".join(f"{k.split('.')[-1]}={fmt_value(v)}" for k, v in params.items()))
        extra = f" (retry of trial {retry_of}, resuming from its checkpoint)" if retry_of is not None else ""
        self._print(f"[dim]{self._clock()}[/] trial {number} started{extra}: {shown}")

    def trial_paused(self, number: int, rung: int, epoch: int) -> None:
        """A trial scheduler paused it (driver/pauses.py): not running, not finished."""
        self.epochs.pop(number, None)
        ts = self.spec.trial_scheduler if self.spec is not None else None
        where = "boundary" if ts is not None and ts.type == "pbt" else "rung"  # (PBT's pause points are boundaries)
        self._print(f"[dim]{self._clock()}[/] trial {number} [cyan]paused[/] at {where} {rung} (epoch {epoch}) | running: {self._running()}")

    def trial_promoted(self, number: int, rung: int, epoch: int) -> None:
        """Promoted at its rung as it reached it: it goes on in its process (driver/pauses.py's go_on)."""
        self._print(f"[dim]{self._clock()}[/] trial {number} [cyan]promoted[/] at rung {rung} (epoch {epoch}): goes on in its process")

    def trial_resumed(self, number: int, epoch: int, checkpoint) -> None:
        self.epochs[number] = epoch
        self._print(f"[dim]{self._clock()}[/] trial {number} resumed after epoch {epoch} (promoted; from {escape(str(checkpoint))})")

    def epoch(self, number: int, epoch: int) -> None:
        self.epochs[number] = epoch
        if self.bar is not None:
            self.bar.update(detail=f"running: {self._running()}", force=False)

    def _running(self) -> str:
        return ", ".join(f"#{n}@ep{e}" for n, e in sorted(self.epochs.items())) or "none"

    def trial_finished(self, number: int, state: str, value: float | None, reason: str | None, counts: dict[str, int],
                       history: dict[int, float] | None = None, trial=None, output: list[str] | None = None) -> None:
        """`value`: the trial's value (COMPLETE) or last reported one; `history`: its reported values by epoch;
        `trial`: the trial as Optuna has it (its constraints: an infeasible trial is never the best);
        `output`: the last lines a failed trial printed."""
        self.epochs.pop(number, None)
        for listener in self.listeners:
            listener(number, state, reason, trial, output or [])
        values = ""
        if isinstance(value, list):  # several objectives: all shown; best/last are the pruning metric's
            names = [o.metric for o in self.spec.objective_list]
            values = "".join(f" {n}={fmt_value(v)}" for n, v in zip(names, value) if n != self.spec.metric)
            value = value[names.index(self.spec.metric)]
        infeasible = trial is not None and not ranking.feasible(trial)
        if state == "COMPLETE" and value is not None and not self.spec.is_multi_objective and not infeasible:
            if ranking.improves(value, self.best, self.spec.direction):
                self.best = value
        colour = {"COMPLETE": "green", "PRUNED": "yellow", "FAIL": "red"}[state]
        best, last = best_and_last(state, value, history, self.spec.direction == "maximize")
        if history is None:  # no history given: `value` is all we know, say which it is
            best, last = (value, None) if state == "COMPLETE" else (None, value)
        shown = ([f"best={fmt_value(best)}"] if best is not None else []) + (
            [f"(last {fmt_value(last)})" if best is not None else f"last={fmt_value(last)}"] if last is not None else [])
        val = (f" {self.spec.metric} {' '.join(shown)}" if shown else "") + values + (" (infeasible)" if infeasible else "")
        why = f" -- {escape(reason)}" if reason else ""
        if output:
            why += "\n        its last output:" + "".join(f"\n        | {escape(line)}" for line in output)
        running = self._running()
        if self.bar is not None:
            self.bar.update(counts["finished"], f"{counts['complete']} complete, {counts['pruned']} pruned, "
                                                f"{counts['fail']} failed{self._best()} | running: {running}")
        self._print(
            f"[dim]{self._clock()}[/] trial {number} [{colour}]{state}[/]{val}{why}\n"
            f"        [{counts['finished']}/{self.spec.n_trials} finished: {counts['complete']} complete, "
            f"{counts['pruned']} pruned, {counts['fail']} failed{self._best()} | running: {running}]"
        )

    def _best(self) -> str:
        return "" if self.spec.is_multi_objective else f" | best {fmt_value(self.best)}"  # (a front has no one best)

    def end(self, study, counts: dict[str, int], spec) -> None:
        if self.quiet or not self.summary:
            return
        if spec.is_multi_objective:
            from hpolab.study.objectives.ranking import front_table

            self.console.print(front_table(study, spec.name, f"{counts['finished']}/{spec.n_trials} finished"))
            self._print_elapsed(spec)
            return
        from optuna.trial import TrialState

        table = Table(title=f"study {spec.name}: {counts['finished']}/{spec.n_trials} finished", show_lines=False)
        table.add_column("trial", justify="right")
        table.add_column("state")
        # A trial's best epoch (its Optuna value when COMPLETE) and its last reported epoch: a pruned
        # trial's last value is what the pruner judged, its best what it reached (the progress line says both).
        table.add_column(f"best {spec.metric}", justify="right")
        table.add_column(f"last {spec.metric}", justify="right")
        for p in spec.search_space:
            table.add_column(p.split(".")[-1], justify="right")
        table.add_column("epochs", justify="right")
        table.add_column("seconds", justify="right")
        trials = [t for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING]
        reverse = spec.direction == "maximize"
        complete = ranking.ranked(trials, [spec.direction])  # (feasible first; a warm start's imported ones with the rest)
        ranked_numbers = {t.number for t in complete}
        others = [t for t in trials if t.number not in ranked_numbers]
        for t in complete + others:
            secs = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
            best, last = best_and_last(t.state.name, t.value, t.intermediate_values, reverse)
            imported = " (imported)" if is_imported(t) else ""  # a warm start's: history for the sampler
            table.add_row(
                str(t.number),
                shown(t) + imported,
                fmt_value(best),
                fmt_value(last),
                *[fmt_value(t.params.get(p)) for p in spec.search_space],
                str(len(t.intermediate_values)),
                f"{secs:.1f}" if secs is not None else "-",
            )
        self.console.print(table)
        counted = count_trials(trials)
        if any(counted.get(k) for k in ASIDE_TEXT):  # as `study status` says it: what the counts leave out
            self.console.print(describe(counted))
        tie = ranking.tie_note(trials, [spec.direction])
        if tie:
            self.console.print(tie)
        self._print_epochs(study, spec, trials)
        self._print_elapsed(spec)

    def _print_epochs(self, study, spec, trials) -> None:
        """Under a trial scheduler or an epoch budget: epochs used (of the budget), trials ended at a rung."""
        if spec.trial_scheduler is None and spec.budget.epochs is None:
            return
        used = epochs_used(trials)
        budget = f" / {spec.budget.epochs} (budget.epochs{over_budget_note(used, spec.budget.epochs)})" if spec.budget.epochs is not None else ""
        at_rung = (paused_counts(trials) or {}).get("at_rung")
        ended = "at a boundary (not resumed)" if spec.trial_scheduler is not None and spec.trial_scheduler.type == "pbt" else \
            "at a rung (never promoted)"
        self.console.print(f"epochs used: {used}{budget}" + (f"; {at_rung} pruned {ended}" if at_rung else ""))
        if spec.budget.epochs is not None and used >= spec.budget.epochs:
            self.console.print(f"the epoch budget is spent: {used}{budget}{self._short_of_the_top(spec, trials)}")

    def _short_of_the_top(self, spec, trials) -> str:
        """A budget spent before any trial reached the top rung: the best at the highest rung reached
        (a PRUNED trial: its run and checkpoints are kept, it has no model; promote needs a COMPLETE one)."""
        from optuna.trial import TrialState

        from hpolab.study.objectives.trial_scheduler import best_at_highest_rung

        if spec.trial_scheduler is None or any(t.state == TrialState.COMPLETE for t in trials):
            return ""
        where = "boundary" if spec.trial_scheduler.type == "pbt" else "rung"  # (PBT's pause points are boundaries)
        found = best_at_highest_rung(trials, spec.direction)
        if found is None:
            finite = f" with a finite {spec.metric}" if any(last_pause(t) for t in trials) else ""
            return f"; no trial reached a {where}{finite}"
        t, epoch = found
        top = getattr(spec.trial_scheduler, "max_epochs", None) or spec.trainer.max_epochs
        end = f"the top rung (epoch {top})" if where == "rung" else f"the end (epoch {top})"
        return (f"; no trial reached {end}; the best at {where} {last_pause(t)['rung']} "
                f"(epoch {epoch}): trial {t.number} {spec.metric} {fmt_value(t.intermediate_values[epoch])}")

    def _print_elapsed(self, spec) -> None:
        stores = getattr(self, "stores", None)
        cmd = stores.command if stores is not None else (lambda rest: f"hpolab {rest}")
        self.console.print(f"elapsed {time.monotonic() - self.t0:.1f} s. Browse the runs: [bold]{escape(cmd('ui'))}[/]   "
                           f"(or: {escape(cmd(f'study status {spec.name}'))})", soft_wrap=True)

    def _clock(self) -> str:
        s = int(time.monotonic() - self.t0)
        return f"{s // 60:02d}:{s % 60:02d}"


def process_started() -> float:
    """time.monotonic() when this process started (Linux's /proc), else now: what a command's
    "elapsed" counts from (its imports, the spec check and the stores' opening included)."""
    import os
    from pathlib import Path

    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.monotonic() - max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic()


def _console() -> Console:
    c = Console(highlight=False)
    # Piped output (CI logs, tests) defaults to 80 columns and truncates the table; give it room.
    return c if c.is_terminal else Console(highlight=False, width=160)


def best_and_last(state: str, value: float | None, history: dict[int, float] | None, maximize: bool) -> tuple[float | None, float | None]:
    """(best, last) reported value of a trial: best is its Optuna value when COMPLETE (the routine's
    best epoch), else the best of its reported epochs; last is the value of its last reported epoch."""
    values = {e: v for e, v in (history or {}).items() if v == v}  # NaN reports are not values
    last = values[max(values)] if values else None
    if state == "COMPLETE" and value is not None:
        return value, last
    if not values:
        return None, None
    return ranking.best_value(values.values(), "maximize" if maximize else "minimize"), last


def fmt_value(v: Any) -> str:
    """A trial value or param for a table cell: 4 significant digits, '-' for none."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
