"""`study check`'s checks of a kept trial model's links (stores/model_links.py): named
`<study>-trial-<n>` (a model logged before models were named, `model`, is accepted: MLflow cannot
rename it), tagged with its trial, state and study, its params the run's, and its objective values
linked as metrics. Repairs re-link from the run's own data (its params, its metric history at the
best epoch): nothing is guessed. A wrong name is reported only. Run tags that name a deleted model
are consistency.py's (`hpolab.model_id` without `hpolab.model_deleted`).
"""

from __future__ import annotations

from typing import Callable

from optuna.trial import FrozenTrial, TrialState

from hpolab.analysis.consistency import Problem
from hpolab.analysis.check_read import Study
from hpolab.stores.model_links import LEGACY_NAME, trial_model_name, trial_model_tags


def model_problems(s: Study, t: FrozenTrial, run) -> list[Problem]:
    tags, run_id = run.data.tags, run.info.run_id
    model_id = tags.get("hpolab.model_id")
    links = s.links.get(model_id) if model_id else None
    if links is None or "hpolab.model_deleted" in tags or run.info.status == "RUNNING" or t.state == TrialState.RUNNING:
        return []  # no live model (consistency.py says whether that is a problem), or still being logged
    out = []
    want = trial_model_name(s.name, t.number)
    if links.name not in (want, LEGACY_NAME):
        out.append(Problem(t.number, f"its logged model {model_id} is named {links.name!r}, not {want!r}",
                           "none: MLflow cannot rename a logged model"))
    bad = {k: v for k, v in trial_model_tags(s.name, t.number, t.state.name).items() if links.tags.get(k) != v}
    if bad:
        out.append(Problem(t.number, f"its logged model {model_id} has " + ", ".join(f"{k}={links.tags.get(k)!r}" for k in bad),
                           "set " + ", ".join(f"{k}={v}" for k, v in bad.items()), _set_model_tags(s, model_id, bad)))
    params = {k: v for k, v in run.data.params.items() if links.params.get(k) != v}
    if params:
        out.append(Problem(t.number, f"its logged model {model_id} lacks the run's params {', '.join(sorted(params))}",
                           "copy them from the run", _log_params(s, model_id, params)))
    held, epoch = tags.get("hpolab.model_epoch"), tags.get("hpolab.best_epoch")
    if held and epoch and held != epoch:
        out.append(Problem(t.number, f"its logged model holds epoch {held}'s weights; the trial's value and the metrics linked to "
                                     f"it are epoch {epoch}'s", "none: log the model of the epoch the trial's value is from"))
    names = _objectives(s, run)
    wrong = [n for n, v in zip(names, t.values or []) if links.metrics.get(n) != v] if t.state == TrialState.COMPLETE else \
        [n for n in names[:1] if n in run.data.metrics and n not in links.metrics]
    if wrong:
        epoch = tags.get("hpolab.best_epoch", "")
        shown = ", ".join(f"{n}={links.metrics.get(n)!r}" for n in wrong)
        out.append(Problem(t.number, f"its logged model {model_id} has {shown} linked, not the trial's objective value",
                           f"link the run's metrics of its best epoch ({epoch or 'unknown'}) to it" if epoch.isdigit() else
                           "none: the run does not say its best epoch (hpolab.best_epoch)",
                           _relink(s, run_id, model_id, int(epoch), names) if epoch.isdigit() else None))
    return out


def _objectives(s: Study, run) -> list[str]:
    """The objective metrics: Optuna's metric names, or the run's `metric` param (one objective)."""
    return list(s.metric_names or [run.data.params.get("metric", "")])


def _set_model_tags(s: Study, model_id: str, tags: dict[str, str]) -> Callable[[], str]:
    def fix() -> str:
        s.client.set_logged_model_tags(model_id, tags)
        return f"model {model_id}: set " + ", ".join(tags)
    return fix


def _log_params(s: Study, model_id: str, params: dict[str, str]) -> Callable[[], str]:
    def fix() -> str:
        s.client.log_model_params(model_id, params)
        return f"model {model_id}: copied {len(params)} params from its run"
    return fix


def _relink(s: Study, run_id: str, model_id: str, epoch: int, names: list[str]) -> Callable[[], str]:
    def fix() -> str:
        from hpolab.stores.model_links import link_trial_metrics

        keys = link_trial_metrics(s.client, run_id, model_id, epoch, names)
        return f"model {model_id}: linked {', '.join(keys)} (epoch {epoch})"
    return fix
