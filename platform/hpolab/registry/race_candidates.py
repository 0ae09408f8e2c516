"""Who races, and on which seeds: a promotion race's candidates and its identity.

Candidates are the study's top-k COMPLETE feasible trials by the study metric (ranking.py; several
objectives: the front members the pick rule takes first, one after another), plus the configuration
of the current alias holder when it was promoted from the same experiment and its run's config can be
read (a version promoted from a race carries its race run's config, seed and all). Each candidate is
its trial's config as its run recorded it (`config.yaml`), so a race retrains what the trial trained,
whatever the spec says now; a study whose retention kept fewer than k models or checkpoints still
races, since nothing but the config is needed.

Seeds are fresh: every trial of the study trained on the study's `seed`; the race's are seed+1 ..
seed+N (RACE_SEED_OFFSET), the same for every candidate (paired). The race is identified by its
candidates' configurations (without their seeds) and its seeds: `race_key`. The same promote run
again finds the same race (a killed one resumes, a finished one is read back, not trained again);
once the study has new leaders, a new race.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpolab.registry.champion import TAG_TRIAL_RUN
from hpolab.registry.serving import TAG_EXPERIMENT
from hpolab.stores.paths import Stores
from hpolab.study.objectives import ranking

RACE_SEED_OFFSET = 1  # the race's seeds: the study's seed + 1, + 2, ...
SEEDLESS = ("seed",)  # what differs between runs of one configuration on other seeds (data_seed does not)


@dataclass
class Candidate:
    label: str  # "trial 19", "champion v3": names its seed trials (stable: a re-run finds them by it)
    config: dict[str, Any]  # the config its run trained (config.yaml)
    trial_number: int | None  # the study trial it is (None: the alias holder's configuration from elsewhere)
    run_id: str  # the run whose config it is
    params: dict[str, Any] = field(default_factory=dict)  # the sampled values (the table's "params")
    value: float | None = None  # its study value (on the study's seed)
    champion: str | None = None  # the alias holder's version, when this is its configuration

    @property
    def shown(self) -> str:
        """The label as the table prints it (a top trial that is the champion's configuration says so)."""
        return self.label + (f" (champion v{self.champion})" if self.champion and self.trial_number is not None else "")

    @property
    def key(self) -> str:
        """The label as a metric-name part: trial_19, champion_v3."""
        return self.label.replace(" ", "_")


def seeds_for(study_seed: int, n: int) -> list[int]:
    return [study_seed + RACE_SEED_OFFSET + i for i in range(n)]


def configuration(config: dict[str, Any]) -> dict[str, Any]:
    """A config without its training seed: what two runs of one configuration share."""
    out = {k: v for k, v in config.items() if k not in SEEDLESS}
    out.setdefault("data_seed", config.get("seed"))  # (a config from before data_seed: its split came from its seed)
    return out


def race_key(candidates: list[Candidate], seeds: list[int], metric: str) -> str:
    text = json.dumps({"configs": sorted(json.dumps(configuration(c.config), sort_keys=True) for c in candidates),
                       "seeds": seeds, "metric": metric}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def read_config(client, stores: Stores, run_id: str) -> dict[str, Any] | None:
    """A run's config.yaml, or None when it has none (or the run is gone)."""
    import mlflow.artifacts
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="config.yaml", dst_path=tmp,
                                                       tracking_uri=stores.tracking_uri)
        except Exception:  # noqa: BLE001 -- no config: it cannot race (the caller says so)
            return None
        return yaml.safe_load(Path(path).read_text())


def top_trials(study, info, k: int, pick_rule: str | None) -> list:
    """The study's k best COMPLETE trials with a run: by value (one objective), or as the pick rule takes
    them from the front one after another (several)."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("mlflow_run_id")]
    if not info.objectives:
        numbers = ranking.top_k(trials, k, ranking.directions_of(study))
        by_number = {t.number: t for t in trials}
        return [by_number[n] for n in numbers if ranking.feasible(by_number[n])]
    from hpolab.registry.pick import picks_in_order

    return picks_in_order(study, trials, info.objectives, pick_rule, k)


def candidates_for(client, stores: Stores, study, info, k: int, pick_rule: str | None, holder) -> tuple[list[Candidate], list[str]]:
    """(the race's candidates, notes on what could not race and why)."""
    out, notes = [], []
    for t in top_trials(study, info, k, pick_rule):
        run_id = t.user_attrs["mlflow_run_id"]
        config = read_config(client, stores, run_id)
        if config is None:
            notes.append(f"trial {t.number}: its run {run_id} has no config.yaml; it cannot race")
            continue
        value = t.values[0] if t.values and not info.objectives else t.user_attrs.get("hpolab.objectives", {}).get(info.metric)
        out.append(Candidate(f"trial {t.number}", config, t.number, run_id, dict(t.params), value))
    holder_candidate(client, stores, info, holder, out, notes)
    return out, notes


def holder_candidate(client, stores: Stores, info, holder, out: list[Candidate], notes: list[str]) -> None:
    """The alias holder's configuration joins the race (or marks the candidate it already is)."""
    if holder is None:
        return
    tags = holder.tags
    version = f"v{holder.version}"
    if tags.get(TAG_EXPERIMENT) != info.experiment:
        notes.append(f"the champion ({version}) comes from another experiment ({tags.get(TAG_EXPERIMENT, 'unknown')}): it does not race")
        return
    run_id = tags.get(TAG_TRIAL_RUN)
    config = read_config(client, stores, run_id) if run_id else None
    if config is None:
        notes.append(f"the champion ({version}): its source run's config.yaml cannot be read; it does not race")
        return
    mine = json.dumps(configuration(config), sort_keys=True)
    for c in out:
        if json.dumps(configuration(c.config), sort_keys=True) == mine:
            c.champion = holder.version  # (the label stays: it names the candidate's seed trials)
            return
    number = tags.get("hpolab.trial_number")
    params = {}
    out.append(Candidate(f"champion {version}", config, None, run_id, params,
                         _float(tags.get(f"hpolab.{info.metric}")), champion=holder.version))
    if number is not None:
        out[-1].params = {"study": tags.get("hpolab.study", "?"), "trial": number}


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "None") else None
    except ValueError:
        return None
