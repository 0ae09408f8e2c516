"""`hpolab study prune-files NAME [--keep N] [--yes]`: apply the default retention to a study made
before it (or with `keep_checkpoints: all`), after saying what goes and how big it is.

It deletes what a study run with `keep_checkpoints: {top_k: N}` and `log_models: {top_k: N}` would
not have kept (retention.py): the checkpoints (trial folder and the run's checkpoints/) and logged
models of finished trials outside the N best, and, for every COMPLETE or PRUNED trial, the files that
have no purpose once it finished: last.pt (nothing resumes it) and the trial folder's best.pt when the
run's checkpoints/best.pt holds the same bytes. Never touched: running trials, the attempts a pending
retry resumes from, the trials a promote run names, config.yaml and every record in the databases
(runs are tagged with what was deleted, so `study check` knows it was on purpose).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from optuna.trial import TrialState

from hpolab.errors import UserError
from hpolab.stores import mlflow_runs as tr
from hpolab.stores.artifacts import CHECKPOINTS
from hpolab.stores.paths import Stores
from hpolab.study.retention.retention import Retention, promoted_in, tidy_finished


@dataclass
class Plan:
    purge: list = field(default_factory=list)  # Retention.purge items with something to delete
    tidy: list = field(default_factory=list)  # (trial, run id, folder): last.pt / duplicate best.pt
    sizes: dict = field(default_factory=lambda: {"checkpoints": [0, 0, 0], "model": [0, 0, 0], "tidy": [0, 0, 0]})  # trials, files, bytes

    def add(self, what: str, files: list[int]) -> bool:
        if files:
            s = self.sizes[what]
            s[0], s[1], s[2] = s[0] + 1, s[1] + len(files), s[2] + sum(files)
        return bool(files)


def _local_sizes(folder: Path, names=("last.pt", "best.pt", "fetched"), seen: set | None = None) -> list[int]:
    """Sizes of the files to delete, each file once: best.pt is often a hard link to last.pt. `seen`:
    (device, inode) of files already counted."""
    seen = set() if seen is None else seen
    out = []
    for n in names:
        p = folder / n
        for f in ([p] if p.is_file() else p.rglob("*") if p.is_dir() else []):
            st = f.stat()
            if f.is_file() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                out.append(st.st_size)
    return out


def _artifacts(client, run_id: str) -> dict[str, int]:
    return {Path(a.path).name: a.file_size or 0 for a in client.list_artifacts(run_id, CHECKPOINTS)}


def _model_size(client, model_id: str) -> list[int]:
    from mlflow.utils.file_utils import local_file_uri_to_path

    m = client.get_logged_model(model_id)
    if not m.artifact_location.startswith("file:"):
        return [0]
    folder = Path(local_file_uri_to_path(m.artifact_location))
    return [f.stat().st_size for f in folder.rglob("*") if f.is_file()] or [0]


def plan_prune(study, client, stores: Stores, keep: int) -> tuple[Retention, Plan]:
    spec = SimpleNamespace(log_models=SimpleNamespace(top_k=keep), keep_checkpoints=SimpleNamespace(top_k=keep))
    retention = Retention(spec, study, lambda n: stores.trial_dir(study.study_name, n))
    items = retention.plan()
    runs, promoted = {}, set()
    exp = client.get_experiment_by_name(study.study_name)
    if exp is not None:
        runs = {r.info.run_id: r for r in tr.find_runs(client, exp.experiment_id, "")}
        promoted = promoted_in(client, exp.experiment_id)
    plan, purged = Plan(), set()
    for what, n, run_id, folder in items:
        run = runs.get(run_id)
        if run_id in promoted or (run is not None and run.info.status == "RUNNING"):
            continue
        tags = run.data.tags if run is not None else {}
        if what == "checkpoints":
            purged.add(n)
            arts = _artifacts(client, run_id) if run is not None and "hpolab.checkpoints_deleted" not in tags else {}
            files = _local_sizes(folder) + list(arts.values())
        else:
            model_id = tags.get("hpolab.model_id")
            files = _model_size(client, model_id) if model_id and "hpolab.model_deleted" not in tags else []
        if plan.add("model" if what == "model" else "checkpoints", files):
            plan.purge.append((what, n, run_id, folder))
    for t in study.get_trials(deepcopy=False):
        run_id = t.user_attrs.get("mlflow_run_id")
        run = runs.get(run_id)
        if t.state not in (TrialState.COMPLETE, TrialState.PRUNED) or t.number in purged or run is None or run.info.status == "RUNNING":
            continue
        folder, arts = stores.trial_dir(study.study_name, t.number), _artifacts(client, run_id)
        best = folder / "best.pt"
        seen: set = set()
        files = _local_sizes(folder, ("last.pt", "fetched"), seen) + ([arts["last.pt"]] if "last.pt" in arts else [])
        if best.is_file() and arts.get("best.pt") == best.stat().st_size:
            files += _local_sizes(folder, ("best.pt",), seen)  # (nothing more when it is last.pt's hard link)
        if plan.add("tidy", files):
            plan.tidy.append((t.number, run_id, folder))
    return retention, plan


def describe(name: str, keep: int, plan: Plan) -> str:
    s = plan.sizes
    mb = lambda b: f"{b / 1e6:.1f} MB"  # noqa: E731
    lines = [f"study {name}: keeping the checkpoints and models of the {keep} best COMPLETE trials and of promoted ones; to delete:",
             f"  checkpoints (last.pt, best.pt) of {s['checkpoints'][0]} finished trials outside the top {keep}: "
             f"{s['checkpoints'][1]} files, {mb(s['checkpoints'][2])}",
             f"  logged models of {s['model'][0]} COMPLETE trials outside the top {keep}: {mb(s['model'][2])}",
             f"  last.pt of {s['tidy'][0]} finished trials (nothing resumes them) and trial-folder copies of best.pt "
             f"already in the artifact store: {s['tidy'][1]} files, {mb(s['tidy'][2])}",
             f"total: {mb(sum(v[2] for v in s.values()))}"]
    return "\n".join(lines)


def prune_files_cmd(args, stores: Stores) -> int:
    from hpolab.stores.mlflow_runs import client_for
    from hpolab.stores.optuna_storage import load_study

    if args.keep < 1:
        raise UserError(f"--keep must be >= 1, got {args.keep}")
    study = load_study(args.name, stores)
    client = client_for(stores)
    retention, plan = plan_prune(study, client, stores, args.keep)
    print(describe(args.name, args.keep, plan))
    if not plan.purge and not plan.tidy:
        print("nothing to delete")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            print("nothing deleted: pass --yes to delete (no terminal to ask on)")
            return 0
        if input("Delete them? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 0
    retention.purge(client, plan.purge)
    for _, run_id, folder in plan.tidy:
        tr.set_tags(client, run_id, tidy_finished(client, run_id, folder))
    print(f"deleted {sum(v[1] for v in plan.sizes.values())} files, {sum(v[2] for v in plan.sizes.values()) / 1e6:.1f} MB")
    return 0
