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
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from optuna.trial import FrozenTrial, TrialState

from hpolab.stores import mlflow_runs as tr
from hpolab.study.objectives import ranking
from hpolab.study.objectives.ranking import rank_tags
from hpolab.stores.artifacts import CHECKPOINTS, delete_checkpoints, delete_logged_model

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
LAST_DELETED = "hpolab.last_checkpoint"  # run tag: last.pt deleted when the trial finished (nothing resumes it)
# A driver's retention passes go out at most this often (and at its last pass): each reads the study's
# trials (Optuna), and its deletes read the runs and the promote runs once (two `runs/search`), so one
# pass per finished trial would cost a read of every trial and two requests per trial. What waits is
# only files that go a few seconds later.
PURGE_EVERY_S = 30.0
# ...or once this driver has finished this many trials since its last pass, whichever comes first: with
# short trials 30 s is a hundred trials or more, whose checkpoints would wait on disk and in the store,
# and whose deletes would all land on one later pass (the first trials of a study paid none of them).
PURGE_EVERY_TRIALS = 25


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
        # when trials_due() last read the trials, rank_tags() ranked (the first: an interval after the start)
        self._read_at = self._ranked_at = time.monotonic()
        self._ended_since_read = 0  # trials this driver finished since trials_due() last read

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

    def trials_due(self, last: bool = False) -> list[FrozenTrial] | None:
        """The study's trials for a pass of plan() and rank_tags() (one read for both), or None when
        no pass is due: between the driver's start and its `last` pass, once PURGE_EVERY_S has
        passed or PURGE_EVERY_TRIALS trials have ended here since the last (a trial that ends
        between costs no read of the study); never when retention has nothing to do (log_models
        none, keep_checkpoints all). Called once per trial this driver finishes."""
        if not self.active and self.log_models == "none":
            return None
        if self.active:  # (only deletes are worth a pass by count: the rank tags keep their own interval)
            self._ended_since_read += 1  # (called once per finished trial, and at the last pass)
        if not last and time.monotonic() - self._read_at < PURGE_EVERY_S and self._ended_since_read < PURGE_EVERY_TRIALS:
            return None
        self._read_at, self._ended_since_read = time.monotonic(), 0
        return self.study.get_trials(deepcopy=False)

    def rank_tags(self, trials: list, force: bool = False) -> dict[int, dict[str, str | None]] | None:
        """The rank tags of the trial models (ranking.py), read on the driver's thread; None when
        they are what the last pass wrote (`force`: the last pass, which may see models logged since),
        or less than PURGE_EVERY_S after the last that did (writing them reads every model of the study:
        one `logged-models/search` per pass); a later pass writes what changed meanwhile."""
        if self.log_models == "none":  # no model to tag
            return None
        if not force and time.monotonic() - self._ranked_at < PURGE_EVERY_S:
            return None
        tags = rank_tags(trials, self.direction)
        if tags == self._ranked and not force:
            return None
        self._ranked, self._ranked_at = tags, time.monotonic()
        return tags

    def plan(self, trials: list | None = None) -> list[tuple[str, int, str | None, Path]]:
        """(what, trial number, run id, trial folder) to delete now: what = "model" | "checkpoints".
        Read on the driver's thread (Optuna); the deletes run on the upload thread (purge). Each is
        handed out once per driver. A driver's passes are paced by trials_due()."""
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
        ids = [i[2] for i in items if i[2] is not None]
        if ids and experiment_id is None:
            experiment_id = client.get_run(ids[0]).info.experiment_id
        runs = tr.runs_by_id(client, experiment_id, ids, deleted=True) if ids else {}
        for run_id, run in runs.items():  # (another worker's runs are not in this process's cache: no runs/get each)
            tr.remember_artifact_uri(client, run_id, run.info.artifact_uri)
        promoted = promoted_in(client, experiment_id) if ids else set()
        for what, n, run_id, folder in items:
            run = runs.get(run_id)
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
