"""What a notification says: the best trial, a new best, a failed trial's last log lines, and each
event's one line (`text`: the whole of a Slack message, a summary in a JSON one)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from hpolab.study.objectives import ranking

RUN_CLOSE_WAIT_S = 60.0  # a failed trial's traceback is uploaded before its run closes: wait for the close


def _trial_fields(t, spec) -> dict[str, Any]:
    names = [o.metric for o in spec.objective_list]
    values = dict(zip(names, t.values)) if t.values is not None else {}
    return {"trial": t.number, "metric": spec.metric, "value": values.get(spec.metric), "values": values, "params": dict(t.params),
            "run_id": t.user_attrs.get("mlflow_run_id")}


def best_of(completed: list, spec) -> dict[str, Any] | None:
    """The study's best trial (ranking.py's: the knee of the front for several objectives), or None."""
    top = ranking.best(completed, [o.direction for o in spec.objective_list])
    return _trial_fields(top, spec) if top is not None else None


def new_best(completed: list, spec, number: int, run_id: str | None, run_link: str | None) -> dict[str, Any] | None:
    """Trial `number`'s new_best fields when it is the study's best now (several objectives: when it
    is on the Pareto front); None otherwise."""
    directions = [o.direction for o in spec.objective_list]
    if spec.is_multi_objective:
        on = [t for t in ranking.front(completed, directions) if t.number == number]
        top = on[0] if on else None
    else:
        top = ranking.best(completed, directions)
        top = top if top is not None and top.number == number else None
    if top is None:
        return None
    return {**_trial_fields(top, spec), "run_id": run_id, "run_link": run_link, "pareto_front": spec.is_multi_objective}


def log_tail(client, run_id: str, lines: int) -> list[str]:
    """The last `lines` of the traceback a failed trial sent (traceback.txt of its run), once its run
    is closed (at most RUN_CLOSE_WAIT_S); [] when it has none (killed by a signal, a timeout)."""
    deadline = time.monotonic() + RUN_CLOSE_WAIT_S
    while client.get_run(run_id).info.status == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    if "traceback.txt" not in [a.path for a in client.list_artifacts(run_id)]:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(client.download_artifacts(run_id, "traceback.txt", tmp)).read_text(errors="replace")
    return [x for x in text.rstrip().splitlines() if x.strip()][-lines:]


def _value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def line(p: dict[str, Any]) -> str:
    """The event in one line."""
    study, event = p["study"], p["event"]
    link = p.get("run_link") or (p.get("links") or {}).get("mlflow_experiment") or ""
    where = f" {link}" if link else ""
    if event == "study_started":
        return f"hpolab: study {study} started on {p['worker']} (n_trials {p.get('n_trials')}, {p.get('parallel')} at a time){where}"
    if event == "study_finished":
        t, best = p.get("trials") or {}, p.get("best")
        shown = f"; best {best['metric']} {_value(best['value'])} (trial {best['trial']})" if best else "; no trial completed"
        return (f"hpolab: study {study} finished ({p.get('reason')}): {t.get('complete', 0)} complete, {t.get('pruned', 0)} pruned, "
                f"{t.get('fail', 0)} failed{shown}{where}")
    if event == "study_error":
        return f"hpolab: study {study} stopped on an error on {p['worker']}: {p.get('error')}"
    if event == "trial_failed":
        return f"hpolab: study {study}: trial {p.get('trial')} failed: {p.get('reason')}{where}"
    if event == "new_best":
        what = "is on the Pareto front" if p.get("pareto_front") else f"is the new best: {p.get('metric')} {_value(p.get('value'))}"
        params = ", ".join(f"{k.split('.')[-1]}={_value(v)}" for k, v in (p.get("params") or {}).items())
        return f"hpolab: study {study}: trial {p.get('trial')} {what} ({params}){where}"
    if event == "worker_lost":
        return f"hpolab: study {study}: a worker was lost: trial {p.get('trial')} {p.get('reason')}"
    if event == "control_changed":
        c = p.get("control") or {}
        return f"hpolab: study {study}: {c.get('change')} by {c.get('by')} (control v{c.get('version')}: {c.get('state')})"
    if event == "champion_changed":
        return (f"hpolab: study {study}: {p.get('model')}@{p.get('alias')} is now version {p.get('version')} (trial {p.get('trial')}, "
                f"was {p.get('previous_version') or 'none'})")
    return f"hpolab: study {study}: {event}"
