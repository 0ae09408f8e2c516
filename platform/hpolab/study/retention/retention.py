"""Retention: which finished trials keep a logged model and their checkpoints (spec `log_models`,
`keep_checkpoints`), as Ray Tune's `num_to_keep` and Determined's checkpoint GC do.

Ranked by the study metric over the study's COMPLETE trials (every worker's: the ranking is read from
Optuna). Running trials are never touched (a trial's running best is kept until it ends); neither is
the chain of a retry that has not finished (it resumes from those checkpoints), nor the earlier
attempts of a kept trial. Deleting is idempotent and marked on the run (`hpolab.checkpoints_deleted`,
`hpolab.model_deleted`), so any worker can do it once the run is closed; a run still RUNNING (another
worker may still be uploading or logging its model) is left for a later pass. A trial someone
promoted keeps its files whatever its rank (promote runs name it: `hpolab.trial_run_id`). The same
passes rewrite the rank tags of the models still kept (ranking.py) where a rank changed.

Checkpoints by purpose (tidy_finished): `last.pt` is for resuming, so it lives only while the trial
can still be resumed (running, or FAIL with a retry to come); a COMPLETE or PRUNED trial loses it (trial
folder, `fetched/` copy and the run's checkpoints/last.pt) when its run closes. `best.pt` is for
promote and comparison: kept once, in the run's checkpoints/ (the trial folder's copy is deleted once
the upload is there with the same size).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Iterable

from optuna.trial import FrozenTrial, TrialState

from hpolab.stores import mlflow_runs as tr
from hpolab.study.objectives import ranking
from hpolab.study.objectives.ranking import rank_tags
from hpolab.stores.artifacts import CHECKPOINTS, delete_checkpoints, delete_logged_model

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
LAST_DELETED = "hpolab.last_checkpoint"  # run tag: last.pt deleted when the trial finished (nothing resumes it)


def top_k(trials: Iterable[FrozenTrial], k: int, direction) -> list[int]:
    """Numbers of the k best COMPLETE trials (ranking.py: by value, or by Pareto rank for several
    objectives; infeasible ones last; ties: the earlier trial first). `direction`: one or a list."""
    return ranking.top_k(trials, k, direction)


def checkpoints_to_delete(trials: list[FrozenTrial], k: int, direction: str) -> list[FrozenTrial]:
    """Finished trials whose checkpoints go under `keep_checkpoints: {top_k: k}`."""
    by_number = {t.number: t for t in trials}
    keep = set(top_k(trials, k, direction))
    for n in list(keep):  # a kept trial's earlier attempts (its best.pt may be an earlier attempt's)
        keep.update(by_number[n].system_attrs.get("retry_history") or [])
    for t in trials:  # a retry still to run or running resumes from its chain
        if t.state in (TrialState.WAITING, TrialState.RUNNING):
            keep.update(t.system_attrs.get("retry_history") or [])
    return [t for t in trials if t.state in FINISHED and t.number not in keep]


def model_skip_reason(policy: Any, state: TrialState, in_top_k: Callable[[int], bool], number: int) -> str | None:
    """Why a finished trial logs no model under `log_models: policy` (None: log it)."""
    if policy == "none":
        return "log_models: none"
    if policy == "all":
        return None if state in (TrialState.COMPLETE, TrialState.PRUNED) else "not finished with a result"
    if state != TrialState.COMPLETE:
        return "not COMPLETE (log_models: complete)" if policy == "complete" else "not COMPLETE"
    if policy == "complete" or in_top_k(number):
        return None
    return f"not in the top {policy.top_k} (log_models: top_k)"


class Retention:
    """The spec's retention policy applied to one study, from this driver."""

    def __init__(self, spec, study, trial_dir: Callable[[int], Path]):
        self.log_models = spec.log_models
        self.keep = spec.keep_checkpoints
        self.study = study
        self.trial_dir = trial_dir  # this worker's folder of a trial (other workers purge their own)
        self._queued: set[tuple[str, int]] = set()  # (what, trial number) queued once per driver
        self._ranked: dict | None = None  # the rank tags the last pass wrote

    @property
    def direction(self) -> list[str]:
        """One, or one per objective (read when ranking: the study is the truth)."""
        return ranking.directions_of(self.study)

    @property
    def active(self) -> bool:
        return not isinstance(self.log_models, str) or not isinstance(self.keep, str)

    def skip_model(self, state: TrialState, number: int) -> str | None:
        def in_top_k(n: int) -> bool:
            return n in top_k(self.study.get_trials(deepcopy=False), self.log_models.top_k, self.direction)

        return model_skip_reason(self.log_models, state, in_top_k, number)

    def rank_tags(self, trials: list, force: bool = False) -> dict[int, dict[str, str | None]] | None:
        """The rank tags of the trial models (ranking.py), read on the driver's thread; None when
        they are what the last pass wrote (`force`: the last pass, which may see models logged since)."""
        if self.log_models == "none":  # no model to tag
            return None
        tags = rank_tags(trials, self.direction)
        if tags == self._ranked and not force:
            return None
        self._ranked = tags
        return tags

    def plan(self, trials: list | None = None) -> list[tuple[str, int, str | None, Path]]:
        """(what, trial number, run id, trial folder) to delete now: what = "model" | "checkpoints".
        Read on the driver's thread (Optuna); the deletes run on the upload thread (purge)."""
        if not self.active:
            return []
        if trials is None:  # (the tracker passes the trials it read for the rank tags too)
            trials = self.study.get_trials(deepcopy=False)
        todo: list[tuple[str, int]] = []
        if not isinstance(self.log_models, str):
            kept = set(top_k(trials, self.log_models.top_k, self.direction))
            todo += [("model", t.number) for t in trials if t.state == TrialState.COMPLETE and t.number not in kept]
        if not isinstance(self.keep, str):
            todo += [("checkpoints", t.number) for t in checkpoints_to_delete(trials, self.keep.top_k, self.direction)]
        out = []
        for what, n in todo:
            if (what, n) not in self._queued:
                self._queued.add((what, n))
                out.append((what, n, trials[n].user_attrs.get("mlflow_run_id"), self.trial_dir(n)))
        return out

    def purge(self, client, items: list[tuple[str, int, str | None, Path]], experiment_id: str | None = None) -> None:
        """Delete what plan() listed (upload thread). A run still RUNNING is left for a later pass, its
        local files included: another worker on the same --store may still be uploading them.
        `experiment_id`: the study's (None: read from the first run)."""
        promoted = promoted_runs(client, items) if experiment_id is None else promoted_in(client, experiment_id)
        for what, n, run_id, folder in items:
            run = client.get_run(run_id) if run_id is not None else None
            if run is not None and run.info.status == "RUNNING":  # first: its files may still be uploading
                self._queued.discard((what, n))
                continue
            if run_id in promoted:  # promote (or a later re-promote) reads its best.pt and model
                continue
            if what == "checkpoints":
                for name in ("last.pt", "best.pt", "fetched"):
                    p = folder / name
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            if run is None:
                continue
            tags = run.data.tags
            if what == "checkpoints" and "hpolab.checkpoints_deleted" not in tags:
                delete_checkpoints(client, run_id)
                tr.set_tags(client, run_id, {"hpolab.checkpoints_deleted": f"keep_checkpoints: top_k {self.keep.top_k}"})
            elif what == "model" and tags.get("hpolab.model_id") and "hpolab.model_deleted" not in tags:
                delete_logged_model(client, tags["hpolab.model_id"])
                tr.set_tags(client, run_id, {"hpolab.model_deleted": f"pushed out of log_models: top_k {self.log_models.top_k}"})


def promoted_runs(client, items: list[tuple[str, int, str | None, Path]]) -> set[str]:
    """Run ids of the trials promote runs name (one query; none when nothing is to be deleted)."""
    run_id = next((i[2] for i in items if i[2] is not None), None)
    return set() if run_id is None else promoted_in(client, client.get_run(run_id).info.experiment_id)


def promoted_in(client, experiment_id: str) -> set[str]:
    """Run ids of the trials that promote runs in this experiment name (`hpolab.trial_run_id`)."""
    runs = client.search_runs([experiment_id], "tags.`hpolab.role` = 'promote'", max_results=10000)
    return {r.data.tags["hpolab.trial_run_id"] for r in runs if "hpolab.trial_run_id" in r.data.tags}


def tidy_finished(client, run_id: str, folder: Path) -> dict[str, str]:
    """A COMPLETE or PRUNED trial (nothing resumes it): delete its last.pt everywhere and the trial
    folder's best.pt once the run's checkpoints/best.pt is there (same size). Tags for its run."""
    # (through the run's cached artifact repository: one request; client.list_artifacts makes four)
    sizes = {Path(a.path).name: a.file_size for a in tr.artifact_repo(client, run_id).list_artifacts(CHECKPOINTS)}
    if "last.pt" in sizes:
        # The tag before the delete: a driver killed in between leaves a run that says so (study check clean).
        tr.set_tags(client, run_id, {LAST_DELETED: "deleted when the trial finished"})
        delete_checkpoints(client, run_id, "last.pt")
    (folder / "last.pt").unlink(missing_ok=True)
    shutil.rmtree(folder / "fetched", ignore_errors=True)
    best = folder / "best.pt"
    if best.is_file() and sizes.get("best.pt") == best.stat().st_size:
        best.unlink()
    return {LAST_DELETED: "deleted when the trial finished"}
