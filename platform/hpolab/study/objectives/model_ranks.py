"""The rank tags of a study's logged trial models, as ranking.py ranks the trials (the one module that
decides best): one objective, `hpolab.rank` (1 = best); several, `hpolab.pareto_rank` (0 = the
feasible front, "infeasible" for a trial that violates a constraint) and `hpolab.on_front`. A trial
that is not COMPLETE (a PRUNED one's model under `log_models: all`) has none.

Ranks change as trials finish: retention's passes (during the study and at its end) rewrite the
tags of the models still kept, one write per model and only where a value changed.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from hpolab.study.objectives import ranking

RANK, PARETO_RANK, ON_FRONT = "hpolab.rank", "hpolab.pareto_rank", "hpolab.on_front"


def rank_tags(trials: Iterable, directions: str | Sequence) -> dict[int, dict[str, str | None]]:
    """Trial number -> the rank tags its model should carry (None: the tag should not be there)."""
    trials = list(trials)
    names = [directions] if isinstance(directions, str) else list(directions)
    order = ranking.ranked(trials, names)
    empty = {RANK: None, PARETO_RANK: None, ON_FRONT: None}
    out: dict[int, dict[str, str | None]] = {t.number: dict(empty) for t in trials}
    if len(names) == 1:
        for i, t in enumerate(order):
            out[t.number][RANK] = str(i + 1)
        return out
    ok = [t for t in order if ranking.feasible(t)]
    ranks = ranking.pareto_ranks(ranking.losses(ok, names)) if ok else []
    front = {t.number for t in ranking.front(ok, names)}
    for t, r in zip(ok, ranks):
        out[t.number].update({PARETO_RANK: str(int(r)), ON_FRONT: str(t.number in front).lower()})
    for t in order:
        if not ranking.feasible(t):
            out[t.number].update({PARETO_RANK: "infeasible", ON_FRONT: "false"})
    return out


def apply_rank_tags(client, experiment_id: str, study: str, tags: dict[int, dict[str, str | None]]) -> int:
    """Rewrite the rank tags of the study's live trial models where they differ; how many changed."""
    from mlflow.exceptions import MlflowException

    from hpolab.stores.model_links import set_changed_tags, study_models, trial_model_of

    changed = 0
    for model in study_models(client, experiment_id):
        number = trial_model_of(model, study)
        if number is None or number not in tags:
            continue
        try:
            changed += set_changed_tags(client, model, tags[number])
        except MlflowException:  # another worker's retention deleted it since the search: nothing to tag
            if _live(client, model.model_id):
                raise
    return changed


def _live(client, model_id: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_logged_model(model_id).status is not None
    except MlflowException:
        return False
