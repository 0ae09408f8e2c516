"""`hpolab report NAME`: one self-contained HTML file about a study, also logged to its parent run.

What it shows, in order: a summary (metric and direction, trial counts, best trial and its params),
the optimization history, every trial's learning curve (pruned trials marked where they stopped),
parameter importances, parallel coordinates, slice plots, the trial timeline, the LR range test
curve (when the study ran one), the top trials table, and the promotion state (which registered
model version holds the `champion` alias, with its test metrics).

It reads the stores and writes nothing but the file (and the artifact on the parent run), so it
works on a study in any state: empty, still running, finished. A plot that cannot be drawn yet (too
few finished trials, nothing sampled) is replaced by a sentence saying why.

Reading the stores is report_data.py, the figures report_figures.py, the HTML pieces report_html.py;
this module lays out the page and is the command.
"""

from __future__ import annotations

import datetime as dt
import html
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hpolab.analysis.report import html as H
from hpolab.analysis.report.data import TOP_ROWS, ReportData, best_number, gather
from hpolab.analysis.report.figures import plots_for, PLOTS, quiet
from hpolab.analysis.report.race import CAPTION as RACE_CAPTION, race_section
from hpolab.analysis.report.sql import gather_sql
from hpolab.analysis.report.trials import model_cell, problem_trials, run_cell, top_trials, trial_row, ui_url_of
from hpolab.stores.paths import Stores
from hpolab.stores.trial_counts import count_trials, epochs_used, paused_counts

ARTIFACT_DIR = "report"  # on the study's parent run: report/<study>.html
TOP_K = TOP_ROWS


# ---------------------------------------------------------------- page


def _when(t: dt.datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else "–"


def _budget(data: ReportData) -> int | None:
    if data.parent_run is None:
        return None
    try:
        # The driver tags the budget of its latest run (params are write-once: the first spec's).
        return int(data.parent_run.data.tags.get("hpolab.n_trials") or data.parent_run.data.params.get("n_trials", ""))
    except ValueError:
        return None


def _in_progress(trials: list) -> int:
    """Running (claimed too) and waiting trials; not a trial scheduler's paused ones (no process: a re-run
    resumes them), by the counting rule of `study status` (stores/trial_counts.py)."""
    counts = count_trials(trials)
    return counts["running"] + counts["waiting"]


def _status(data: ReportData, budget: int | None, running: int, any_trials: bool) -> str:
    finished = data.finished
    if running:
        return f"running <small>({running} trial{'s' * (running > 1)} in progress)</small>"
    if budget is not None and finished >= budget:
        return "finished <small>(budget reached)</small>"
    if any_trials:
        return "stopped <small>(re-run to continue)</small>" if budget and finished < budget else "idle"
    return "empty"


def _summary_cards(data: ReportData, trials: list, best: int | None, paused: dict[str, int] | None) -> str:
    c = data.counts
    budget = _budget(data)
    finished = data.finished
    if budget is not None and budget >= finished:
        done = f"{finished} <small>of {budget} (budget)</small>"
    else:
        done = f"{finished}"
    status = _status(data, budget, _in_progress(trials), bool(trials))
    direction = "higher is better" if data.direction == "maximize" else "lower is better"
    items = [
        ("status", status),
        ("metric", f"{H.esc(data.metric)} <small>{data.direction} ({direction})</small>"),
        ("trials finished", done),
        ("complete / pruned / failed",
         f"<span class=state-COMPLETE>{c['COMPLETE']}</span> / <span class=state-PRUNED>{c['PRUNED']}</span> / "
         f"<span class=state-FAIL>{c['FAIL']}</span>"),
    ]
    if len(data.study.directions) > 1:  # several objectives: what they are, and the front
        items[1] = ("objectives", ", ".join(f"{H.esc(n)} <small>{d}</small>" for n, d in _objectives(data)) +
                    f" <small>(pruning on {H.esc(data.metric)})</small>")
        if best is not None:
            items.append(("Pareto front", f"{_front_size(data)} trials <small>knee: trial {best}</small>"))
    elif best is not None:
        items.append(("best " + data.metric, f"{H.fmt_num(data.study.trials[best].value)} <small>trial {best}</small>"))
    return H.cards(items + _scheduler_card(trials, paused))


def _scheduler_card(trials: list, paused: dict[str, int] | None) -> list[tuple[str, str]]:
    """Under a trial scheduler (ASHA, PBT): how many trials wait paused, how many ended at a rung, epochs used."""
    if paused is None:
        return []
    return [("paused / pruned at a rung", f"{paused['paused']} / {paused['at_rung']} <small>{epochs_used(trials)} epochs used</small>")]


def _objectives(data: ReportData) -> list[tuple[str, str]]:
    from hpolab.study.objectives.ranking import directions_of

    return list(zip(data.study.metric_names or [], directions_of(data.study)))


def _front_size(data: ReportData) -> int:
    from hpolab.study.objectives import ranking

    return len(ranking.front(data.study.get_trials(deepcopy=False), ranking.directions_of(data.study)))


def _summary_notes(data: ReportData, trials: list) -> list[str]:
    finished = data.finished
    running = _in_progress(trials)
    out = []
    if finished == 0:
        out.append(H.note("<b>No finished trials yet.</b> The plots below fill in as trials finish; "
                          "run <code>hpolab study run SPEC</code>, then <code>hpolab report</code> again.", warn=True))
    elif finished == 1:
        out.append(H.note("<b>Only one finished trial.</b> Comparisons, importances and trends need more trials; "
                          "what is shown below is that one trial.", warn=True))
    if running:
        out.append(H.note(f"This study was still running when the report was made ({running} trial"
                          f"{'s' * (running > 1)} in progress); their curves are dotted and may be incomplete."))
    return out


def _best_trial_html(data: ReportData, best: int | None) -> list[str]:
    if best is None:
        if data.finished:
            return [H.note("No trial has completed yet (all finished trials were pruned or failed), so there is no best trial.")]
        return []
    bt = data.study.trials[best]
    rows = [(k, H.fmt_num(v) if isinstance(v, float) else v) for k, v in sorted(bt.params.items())]
    run = bt.user_attrs.get("mlflow_run_id")
    if len(bt.values) > 1:  # several objectives: the knee of the front, with each objective
        shown = ", ".join(f"{H.esc(n)} = {H.fmt_num(v, 6)}" for (n, _), v in zip(_objectives(data), bt.values))
        out = [f"<h3>Knee of the Pareto front: trial {best} &mdash; {shown}</h3>"]
    else:
        out = [f"<h3>Best trial: {best} &mdash; {H.esc(data.metric)} = {H.fmt_num(bt.value, 6)}</h3>"]
    if rows:
        out.append(H.table(["parameter", "value"], rows))
    if run:
        model = model_cell(data, trial_row(data, best))
        out.append(f"<p class=\"caption\">MLflow run {run_cell(data, run)}{' &middot; logged model ' + model if model != '–' else ''}</p>")
    return out


def _summary(data: ReportData) -> str:
    s = data.study
    trials = s.get_trials(deepcopy=False)
    best = best_number(data)
    out = [f"<h1>Study {H.esc(s.study_name)}</h1>"]
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    span = f"trials ran from {_when(min(starts))} to {_when(max(ends) if ends else None)}" if starts else "no trial has started"
    out.append(f"<p class=\"sub\">Hyperparameter study report &middot; {span} &middot; generated {_when(dt.datetime.now())}</p>")
    paused = paused_counts(trials)  # (one pass: the cards and the notes both say it)
    out.append(_summary_cards(data, trials, best, paused))
    out += _summary_notes(data, trials)
    out += _best_trial_html(data, best)
    return "\n".join(out)


def _promotion_html(data: ReportData) -> str:
    p = data.promotion
    name = H.esc(data.study.study_name)
    if p.get("state") == "unknown":
        return H.note("The model registry could not be read, so the promotion state is unknown.", warn=True)
    if p.get("state") == "none":
        return H.note(f"Not promoted yet: there is no registered model named <b>{name}</b>. "
                      f"Run <code>hpolab promote {name}</code> to evaluate the best trial on the held-out test split "
                      "and register it as the <code>champion</code>.")
    out = []
    name = H.esc(p.get("name") or data.study.study_name)
    champ = p.get("champion")
    if champ is not None:
        tags = dict(champ.tags or {})
        trial = _version_trial(data, champ)
        # numeric test results only (promote also records e.g. a fingerprint of the test split)
        test = {k.removeprefix("hpolab."): v for k, v in tags.items() if "test" in k.lower() and _is_float(v)}
        main = _main_test_metric(test, data.metric, tags.get("hpolab.gate_metric"))
        line = f"<b>Champion: {name} version {H.esc(champ.version)}</b>"
        if trial is not None:
            line += f", from trial {trial}"
        if main:
            line += f" &mdash; {H.esc(main[0])} = <b>{H.esc(_fmt_tag(main[1]))}</b> on the held-out test split"
        out.append(f"<p>{line}</p>")
        rows = [(k, _fmt_tag(v)) for k, v in sorted(test.items())]
        if rows:
            out.append(H.table(["test metric", "value"], rows))
        if champ.description:
            out.append(f"<p class=\"caption\">{H.esc(champ.description)}</p>")
        out.append(f"<p class=\"caption\">model URI <span class=mono>models:/{name}@champion</span></p>")
    else:
        out.append(H.note(f"The registered model <b>{name}</b> exists but no version holds the <code>champion</code> alias."))
    versions = p.get("versions") or []
    if versions:
        rows = []
        for v in versions[:20]:
            aliases = ", ".join(p["version_aliases"].get(str(v.version), [])) or "–"
            created = dt.datetime.fromtimestamp(v.creation_timestamp / 1000) if v.creation_timestamp else None
            gate = (v.tags or {}).get("hpolab.gate_metric")
            test_value = (v.tags or {}).get(f"hpolab.{gate}") if gate else None
            rows.append([v.version, aliases, _version_trial(data, v), f"{gate} {_fmt_tag(test_value)}" if test_value else "–", _when(created)])
        out.append("<h3>Registered versions</h3>")
        out.append(H.table(["version", "aliases", "trial", "test metric", "registered"], rows, [True, False, True, False, False]))
    return "\n".join(out)


def _version_trial(data: ReportData, version) -> int | None:
    """The trial a registered version came from: its lineage tag, else its run."""
    tags = version.tags or {}
    try:
        return int(tags["hpolab.trial_number"])
    except (KeyError, ValueError):
        return _trial_of_run(data, tags.get("hpolab.trial_run_id") or version.run_id)


def _fmt_tag(v: str) -> str:
    try:
        return H.fmt_num(float(v), 5)
    except (TypeError, ValueError):
        return str(v)


def _main_test_metric(test: dict[str, str], metric: str, gate: str | None = None) -> tuple[str, str] | None:
    """The test metric to headline: the promotion gate's, else the one matching the study metric."""
    base = metric.removeprefix("val_")
    for key in (gate, f"test_{base}", f"test_{metric}"):
        if key and key in test:
            return key, test[key]
    numeric = [(k, v) for k, v in sorted(test.items()) if _is_float(v)]
    return numeric[0] if numeric else None


def _is_float(v: Any) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def _trial_of_run(data: ReportData, run_id: str | None) -> int | None:
    if not run_id:
        return None
    for t in data.study.get_trials(deepcopy=False):
        if t.user_attrs.get("mlflow_run_id") == run_id:
            return t.number
    return None


def render(data: ReportData) -> str:
    from plotly.offline import get_plotlyjs

    quiet()
    parts = [_summary(data)]
    plots = plots_for(data)
    toc = [(k, title) for k, title, _, _ in plots] + [("top-trials", "Top trials"), ("race", "Promotion race"), ("promotion", "Promotion")]
    parts.append("<nav class=\"toc\">" + "".join(f"<a href=\"#{k}\">{H.esc(t)}</a>" for k, t in toc) + "</nav>")
    for key, title, make, caption in plots:
        try:
            fig, why = make(data)
        except Exception as e:  # one plot must never cost the whole report
            fig, why = None, f"This plot failed: {html.escape(type(e).__name__ + ': ' + str(e))}"
        content = H.figure(fig, key) if fig is not None else H.note(why)
        parts.append(H.section(key, title, html.escape(caption.format(metric=data.metric)), content))
    parts.append(H.section("top-trials", "Top trials", f"The best complete trials by {H.esc(data.metric)} ({data.direction}).",
                           top_trials(data) + problem_trials(data)))
    parts.append(H.section("race", "Promotion race", RACE_CAPTION.format(metric=H.esc(data.metric)), race_section(data)))
    parts.append(H.section("promotion", "Promotion",
                           "Which trained model is promoted: the MLflow Model Registry entry named like the study, and the "
                           "version holding the <code>champion</code> alias with its held-out test metrics.",
                           _promotion_html(data)))
    footer = [f"Optuna study <b>{H.esc(data.study.study_name)}</b>"]
    if data.parent_run is not None:
        footer.append(f"MLflow parent run <span class=mono>{H.esc(data.parent_run.info.run_id)}</span>")
    footer += [H.esc(p) for p in data.problems]
    parts.append("<footer>" + " &middot; ".join(footer) + "</footer>")
    return H.page(f"Study {data.study.study_name} — hpolab report", "\n".join(parts), get_plotlyjs())


# ---------------------------------------------------------------- command


def _read_only(study, stores: Stores):
    """The study, for reading: Optuna's plots ask for `study.trials` / `get_trials()`, a deep copy of
    every trial on each call; the report never changes a trial, so it hands them the same objects
    (four copies of 1,000 trials took about 2.5 s of a report). On an embedded store they
    are read once with plain SQL (optuna_sql.read_study: 0.1 s instead of 0.5 s for 1,000 trials)."""
    import optuna

    from hpolab.stores.optuna_sql import read_study, source

    path = source(stores.optuna_url)  # (an embedded file, or PostgreSQL's tables: optuna_sql.py)
    snapshot = read_study(path, study.study_name) if path is not None else None

    class ReadOnlyStudy(optuna.Study):
        def get_trials(self, deepcopy: bool = True, states=None):
            if snapshot is None:
                return super().get_trials(deepcopy=False, states=states)
            return snapshot.get_trials(states=states)

    return ReadOnlyStudy(study_name=study.study_name, storage=study._storage)


def write_report(name: str, stores: Stores, out: Path | None = None, ui_url: str | None = None) -> tuple[Path, ReportData]:
    """`ui_url`: the MLflow UI the page links trials' runs and models to (default: the tracking server's)."""
    from hpolab.stores.optuna_storage import load_study

    ui_url = ui_url_of(stores.tracking_uri, ui_url)  # (a bad --ui-url is refused before anything is read)
    study = _read_only(load_study(name, stores), stores)
    data = gather_sql(study, stores) or gather(study, stores)  # an embedded store: plain SQL (report_sql.py)
    data.ui_url = ui_url
    out = Path(out) if out else stores.root / "reports" / f"{name}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(data), encoding="utf-8")
    return out, data


def log_report(data: ReportData, path: Path, stores: Stores) -> str | None:
    """Log the report on the study's parent run as report/<study>.html; returns the artifact path.
    A run whose artifacts are a local folder (an embedded store) gets the file copied there, as
    MLflow's local artifact repository does, without importing MLflow; any other goes
    through MlflowClient."""
    if data.parent_run is None:
        return None
    from hpolab.stores.artifacts import local_artifact_dir

    run_id = data.parent_run.info.run_id
    artifact_name = f"{data.study.study_name}.html"
    folder = local_artifact_dir(data.parent_run.info.artifact_uri)
    if data.client is None and folder is not None:
        (folder / ARTIFACT_DIR).mkdir(parents=True, exist_ok=True)
        partial = folder / ARTIFACT_DIR / f".{artifact_name}.partial"
        shutil.copyfile(path, partial)
        partial.replace(folder / ARTIFACT_DIR / artifact_name)  # (never a half-written page in the UI)
        return f"{ARTIFACT_DIR}/{artifact_name}"
    client = data.client
    if client is None:
        from hpolab.stores.mlflow_runs import client_for

        client = client_for(stores)
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / artifact_name
        p.write_bytes(Path(path).read_bytes())
        client.log_artifact(run_id, str(p), ARTIFACT_DIR)
    return f"{ARTIFACT_DIR}/{artifact_name}"


def report_and_log(name: str, stores: Stores, out: Path | None = None, ui_url: str | None = None) -> Path:
    """Write the report, log it to the study's parent run, print where each went; the file's path."""
    out, data = write_report(name, stores, out, ui_url)
    print(f"report: {out}")
    if data.finished < 2:
        print(f"note: the study has {data.finished} finished trial{'s' * (data.finished != 1)}; the report says what is missing")
    try:
        artifact = log_report(data, out, stores)
    except Exception as e:  # the local file is the main product; say why MLflow did not get a copy
        print(f"warning: could not log the report to MLflow: {e}")
        return out
    if artifact:
        print(f"logged to MLflow: run {data.parent_run.info.run_id}, artifact {artifact} (open it with `{stores.command('ui')}`)")
    else:
        print("not logged to MLflow: the study has no parent run in the tracking store")
    return out


def report_cmd(args, stores: Stores) -> int:
    report_and_log(args.name, stores, Path(args.out) if args.out else None, getattr(args, "ui_url", None))
    return 0
