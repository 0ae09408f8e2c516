"""A study remembers the spec it was created with, and refuses a changed one unless told.

What defines a study (DEFINING) is recorded when it is created: as Optuna study user attrs
(`hpolab.spec`: those parts, `hpolab.spec_hash`, `hpolab.spec_version`; Optuna is the source of
truth for "this study exists") and on its MLflow parent run (`spec.yaml`, the whole spec as run;
tags `hpolab.spec_hash`, `hpolab.spec_version`).

Re-running with a different definition is refused (exit 2, nothing written) with the diff:
    - experiment, metric, direction: always refused; the trials would not be comparable.
      Run the spec as a new study (`--new-study NAME`).
    - search_space, sampler, pruner, seed, data_seed, trainer/model/data fixed values, lr_range_test, trial_scheduler: refused
      unless `--allow-spec-change`; for the search space only when every value the study has
      already sampled still lies inside the new distribution (and Optuna can store it: same kind,
      same log scale, same categorical choices); for trial_scheduler only while no trial is paused
      (only the recorded scheduler resumes or ends them). Accepted changes are recorded as `spec-<n>.yaml`.
Run controls never count (nor trainer placement knobs: PLACEMENT below): name, n_trials, timeout, trial_timeout, parallel, max_retries, max_interrupts, enqueue,
stop_after_no_improvement,
log_models, keep_checkpoints, checkpoint_upload_every, storage_outage_grace.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.distributions import check_distribution_compatibility
from optuna.trial import TrialState

from hpolab.config.spec import StudySpec, spec_to_yaml
from hpolab.errors import UserError
from hpolab.stores import mlflow_runs as tr
from hpolab.stores.trial_states import PAUSED_STATES, states
from hpolab.study.lr_test.lr_step import lr_bounds
from hpolab.study.sampling.search_space import optuna_distributions

DEFINING = ("experiment", "metric", "direction", "objectives", "pruning", "constraints", "search_space", "sampler",
            "pruner", "seed", "data_seed", "trainer", "model", "data", "lr_range_test", "trial_scheduler")
FIXED = ("experiment", "metric", "direction", "objectives")  # never changed in place, even with --allow-spec-change
ONLY_IF_SET = ("objectives", "pruning", "constraints", "trial_scheduler")  # absent from a plain study's record, as before they existed
_ABSENT = object()


# Where and how fast a trial runs, not what it means: moving a study to a GPU box (device, devices,
# more loader workers, compile) must not need --allow-spec-change.
PLACEMENT = ("device", "devices", "num_workers", "eval_batch_size", "compile", "channels_last")


def defining_spec(spec: StudySpec) -> dict[str, Any]:
    """The parts of a spec that say what a trial means (JSON-able: stored as an Optuna user attr)."""
    out = spec.model_dump(mode="json", include=set(DEFINING))
    out["trainer"] = {k: v for k, v in out["trainer"].items() if k not in PLACEMENT}
    for key in ONLY_IF_SET:
        if not out[key]:
            del out[key]
    if out["data_seed"] is None:  # (the split follows `seed`, as for studies made before data_seed existed)
        del out["data_seed"]
    return out


def spec_hash(defining: dict[str, Any]) -> str:
    text = json.dumps(defining, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def spec_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted path, old, new) for every leaf that differs; a missing side is _ABSENT."""
    out = []
    for key in list(old) + [k for k in new if k not in old]:
        a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += spec_diff(a, b, path + ".")
        elif a != b:
            out.append((path, a, b))
    return out


def _only_a_new_default(change: tuple[str, Any, Any]) -> bool:
    """A key one side lacks and the other has at its default: a field hpolab added (or dropped) since
    the study was recorded, not an edit (upgrading hpolab must not make every study refuse its spec)."""
    path, a, b = change
    if a is not _ABSENT and b is not _ABSENT:
        return False
    node: Any = defining_spec(StudySpec(name="defaults", experiment="defaults"))
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return node == (b if a is _ABSENT else a)


def _show(v: Any) -> str:
    return "(absent)" if v is _ABSENT else json.dumps(v)


@dataclass
class SpecChange:
    """A spec to record on the study: the first one (version 0) or an accepted change."""

    version: int
    defining: dict[str, Any]
    diff: list[tuple[str, Any, Any]]


def check_spec(study: optuna.Study, spec: StudySpec, allow_change: bool) -> SpecChange | None:
    """None when the spec is the recorded one; else what to record, or UserError (nothing written)."""
    new = defining_spec(spec)
    old = study.user_attrs.get("hpolab.spec")
    if old is None:  # a new study, or one created before specs were recorded: this one is its spec
        return SpecChange(version=0, defining=new, diff=[])
    diff = [d for d in spec_diff(old, new) if not _only_a_new_default(d)]
    if not diff:
        return None
    fixed = [d for d in diff if d[0].split(".")[0] in FIXED]
    if fixed or not allow_change:
        raise UserError(_refusal(spec, old, new, diff, fixed))
    stranded = paused_trials(study) if any(d[0].split(".")[0] == "trial_scheduler" for d in diff) else []
    if stranded:
        shown = ", ".join(str(n) for n in stranded[:10]) + (" ..." if len(stranded) > 10 else "")
        raise UserError(
            f"study {spec.name!r}: --allow-spec-change refused: trial_scheduler changed while {len(stranded)} trial"
            f"{'s are' if len(stranded) > 1 else ' is'} paused (trial {shown}); only the recorded trial scheduler resumes or "
            f"ends them. Run the recorded spec until they finish, or run the edited spec as a new study: --new-study {spec.name}-2")
    problems = search_space_problems(study, spec)
    if problems:
        shown = problems[:8] + ([f"... and {len(problems) - 8} more"] if len(problems) > 8 else [])
        raise UserError(
            f"study {spec.name!r}: --allow-spec-change refused: the study's trials do not fit the new search space:\n"
            + "\n".join(f"  {p}" for p in shown)
            + f"\nRun the edited spec as a new study instead: --new-study {spec.name}-2")
    return SpecChange(version=int(study.user_attrs.get("hpolab.spec_version", 0)) + 1, defining=new, diff=diff)


def paused_trials(study: optuna.Study) -> list[int]:
    """The study's paused (and put-back) trials: a trial scheduler's, waiting for it to resume them."""
    return [t.number for t, state in states(study.get_trials(deepcopy=False)) if state in PAUSED_STATES]


def _refusal(spec: StudySpec, old: dict, new: dict, diff: list, fixed: list) -> str:
    lines = [f"study {spec.name!r} exists with another spec (recorded {spec_hash(old)}, this one {spec_hash(new)}); changed:"]
    lines += [f"  {path}: {_show(a)} -> {_show(b)}" for path, a, b in diff]
    lines.append("Options:")
    lines.append(f"  --new-study NAME       run this spec as a new study named NAME (e.g. --new-study {spec.name}-2)")
    if fixed:
        names = ", ".join(sorted({d[0].split('.')[0] for d in fixed}))
        lines.append(f"  ({names} cannot change within a study, even with --allow-spec-change: the trials would not be comparable)")
    else:
        lines.append("  --allow-spec-change    continue this study with the changed spec (recorded as spec-<n>.yaml on its parent run);")
        lines.append("                         a search space change is accepted only if every value the study sampled still fits it")
    lines.append("  or undo the edit (the recorded spec is spec.yaml on the study's MLflow parent run)")
    return "\n".join(lines)


def search_space_problems(study: optuna.Study, spec: StudySpec) -> list[str]:
    """Every (trial, param) of the study that the new search space could not have sampled, and every
    param whose distribution Optuna cannot change within a study (kind, log scale, categorical choices)."""
    if _needs_lr_bounds(spec, study):
        return ["the search space takes bounds from the LR range test, which this study has not run yet"]
    new = optuna_distributions(spec, lr_bounds(study))
    problems: list[str] = []
    incompatible: set[str] = set()
    for t in study.get_trials(deepcopy=False):
        params = t.params if t.state != TrialState.WAITING else t.system_attrs.get("fixed_params", {})
        for path, value in params.items():
            if path in incompatible:
                continue
            if path not in new:
                problems.append(f"trial {t.number}: {path}={value!r}, but the new spec does not search {path}")
                continue
            old = t.distributions.get(path)
            try:
                if old is not None:
                    check_distribution_compatibility(old, new[path])
            except ValueError:
                incompatible.add(path)
                problems.append(f"{path}: an Optuna study cannot change a parameter's kind, log scale or categorical "
                                f"choices ({describe(old)} -> {describe(new[path])})")
                continue
            if not new[path]._contains(new[path].to_internal_repr(value)):  # Optuna's own check of a fixed param
                problems.append(f"trial {t.number}: {path}={value!r} is outside the new {describe(new[path])}")
    return problems


def describe(d) -> str:
    """An Optuna distribution as a spec reader would write it."""
    if isinstance(d, optuna.distributions.CategoricalDistribution):
        return f"choices {list(d.choices)}"
    kind = "int" if isinstance(d, optuna.distributions.IntDistribution) else "float"
    extra = ", log" if d.log else f", step {d.step}" if d.step not in (None, 1) else ""
    return f"{kind} [{d.low!r}, {d.high!r}{extra}]"


def _needs_lr_bounds(spec: StudySpec, study: optuna.Study) -> bool:
    return any(getattr(d, "from_lr_range_test", False) for d in spec.search_space.values()) and lr_bounds(study) is None


def record_spec(study: optuna.Study, client, parent_run_id: str, spec: StudySpec, change: SpecChange | None,
                note: Callable[[str], None]) -> None:
    """Record the first spec or an accepted change: Optuna user attrs + an artifact and tags on the parent run."""
    if change is None:
        return
    digest = spec_hash(change.defining)
    study.set_user_attr("hpolab.spec", change.defining)
    study.set_user_attr("hpolab.spec_hash", digest)
    study.set_user_attr("hpolab.spec_version", change.version)
    study.set_user_attr("metric", spec.metric)  # `hpolab study list` reads it without MLflow
    name = "spec.yaml" if change.version == 0 else f"spec-{change.version}.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / name
        header = "".join(f"# changed {path}: {_show(a)} -> {_show(b)}\n" for path, a, b in change.diff)
        p.write_text(f"# spec hash {digest}, version {change.version}\n{header}{spec_to_yaml(spec)}")
        client.log_artifact(parent_run_id, str(p))
    tr.set_tags(client, parent_run_id, {"hpolab.spec_hash": digest, "hpolab.spec_version": str(change.version)})
    if change.version:
        note(f"spec change accepted (--allow-spec-change): recorded as {name} on the parent run, hash {digest}")
