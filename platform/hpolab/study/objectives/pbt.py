"""PBT: population based training (Jaderberg et al. 2017), on the pause/resume of trial_scheduler.py.

`population` configurations are sampled (n_trials = population), one Optuna trial and one MLflow run
each for the member's whole life. A member trains to the next multiple of `interval_epochs` (a
boundary t) and pauses there. Once every member still alive has reached t, the decision for t is
made, the same on every worker and on a re-run (a random.Random seeded by the study seed, the
member and t): the members are ranked by their value at t (the intermediate value at epoch t, in
the spec's direction; NaN worst); a member in the bottom `quantile` exploits one of the top
`quantile` (resumes from that donor's checkpoint of the same boundary t, so its epoch axis goes on
without a jump, with the donor's configuration) and explores (each `mutations` key perturbed, or
redrawn: pbt_explore.py). The others resume from their own checkpoint with their own config. A
member reaching max_epochs completes as any trial does.

Per boundary, each member's last.pt (and best.pt) is copied to `pbt_epoch_<t>.pt` (`_best.pt`) in its
first attempt's trial folder when the decision for t is first made (before any member at t resumes and
overwrites its last.pt): what a donor gives at t. Deleted once every member still alive is past t.

What a member followed is kept on its trial (user attrs, so a re-run sees it) and its MLflow run:
    SCHEDULE_ATTR  {"<first epoch>": {mutated key: value}}: the values from that epoch on ("1": its start)
    PARENTS_ATTR   ["<donor member>@<t>", ...]: each exploit (a member is its first attempt's number)
    tags PARENTS_TAG ("3@4,5@8") and EXPLOITED_TAG (the last one); metrics "pbt.<key>" at each resume epoch.
"""

from __future__ import annotations

import math
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from hpolab.stores.trial_counts import last_reported
from hpolab.study.objectives.pbt_explore import explore
from hpolab.study.state import lifecycle
from hpolab.study.objectives.trial_scheduler import CHANGES_ATTR, Resume, chain_root, interrupted_resume, paused_at, score

SCHEDULE_ATTR = "hpolab.pbt_schedule"
PARENTS_ATTR = "hpolab.pbt_parents"
PARENTS_TAG = "hpolab.pbt_parents"
EXPLOITED_TAG = "hpolab.pbt_exploited_from"
METRIC_PREFIX = "pbt."  # the schedule as metrics: "pbt.trainer.lr" at step = epoch
ALIVE = (TrialState.RUNNING, TrialState.WAITING)  # a member whose latest attempt is one of these may still report


def snapshot_name(epoch: int) -> str:
    return f"pbt_epoch_{epoch}.pt"


@dataclass
class Member:
    """One configuration of the population: its attempts (a retry copy continues the same member)."""

    root: int  # the first attempt's trial number: the member's name
    attempts: list[FrozenTrial] = field(default_factory=list)  # by trial number

    @property
    def latest(self) -> FrozenTrial:
        return self.attempts[-1]

    @property
    def alive(self) -> bool:
        return self.latest.state in ALIVE

    def value_at(self, epoch: int) -> float | None:
        for t in reversed(self.attempts):
            if epoch in t.intermediate_values:
                return t.intermediate_values[epoch]
        return None

    def user_attr(self, key: str, default: Any) -> Any:
        for t in reversed(self.attempts):
            if key in t.user_attrs:
                return t.user_attrs[key]
        return default


def members_of(trials: list[FrozenTrial]) -> dict[int, Member]:
    out: dict[int, Member] = {}
    for t in sorted(trials, key=lambda t: t.number):
        out.setdefault(chain_root(t), Member(chain_root(t))).attempts.append(t)
    return out


@dataclass
class Decision:
    """What happens to `member` at boundary `epoch`: its config from epoch+1 on, and where it resumes from."""

    member: int
    epoch: int
    donor: int | None  # the member exploited (None: it keeps its own checkpoint and config)
    config: dict[str, Any]  # the member's dotted config keys that differ from the spec (params + changes)
    values: dict[str, Any]  # the mutated keys' values from epoch+1 on


class Pbt:
    """The PBT trial scheduler (trial_scheduler.py's interface)."""

    fails_never_finite = False  # a member whose value is NaN at a boundary ranks worst there and exploits a better one
    goes_on_when_next = False  # next_resume keeps boundary snapshots (files): it runs only for a claim

    def __init__(self, spec, stores=None):
        ts = spec.trial_scheduler
        self.spec, self.stores = spec, stores
        self.population, self.interval, self.quantile = ts.population, ts.interval_epochs, ts.quantile
        self.mutations, self.resample_probability = dict(ts.mutations), ts.resample_probability
        self.max_epochs = spec.trainer.max_epochs
        self.maximize = spec.direction == "maximize"
        self.seed = spec.seed
        self._tidied_below: float | None = None  # the lowest epoch of the last tidy (its copies below it are gone)

    # ---------------------------------------------------------------- the interface

    def pause_epoch(self, trial: FrozenTrial, start_epoch: int) -> int | None:
        boundary = math.ceil(start_epoch / self.interval) * self.interval
        return boundary if boundary < self.max_epochs else None

    def rung_index(self, trial: FrozenTrial, epoch: int) -> int | None:
        """The boundary index of `epoch` (0: the first boundary); None between boundaries and at max_epochs."""
        return epoch // self.interval - 1 if epoch % self.interval == 0 and 0 < epoch < self.max_epochs else None

    def top_epochs(self) -> int:
        """trainer.max_epochs of every member (a trial scheduler refuses it searched or mutated)."""
        return self.max_epochs

    def may_start_new(self, trials: list[FrozenTrial]) -> bool:
        """Fewer members than the population; or a WAITING retry copy (Optuna's ask() takes it first:
        an existing member continues, no new configuration is sampled)."""
        return len(members_of(trials)) < self.population or any(t.state == TrialState.WAITING for t in trials)

    def next_resume(self, trials: list[FrozenTrial]) -> Resume | None:
        """The member paused longest (lowest boundary, then number) whose boundary is decided."""
        members = members_of(trials)
        self.tidy(members)
        first = interrupted_resume(trials, lambda n: self.trial_dir(n) / "last.pt")  # (a segment its dead driver never finished)
        if first is not None:
            return first
        for epoch, _, trial in sorted((paused_at(t)["epoch"], t.number, t) for t in trials if paused_at(t)):
            if not self.ready(members, epoch):
                continue
            self.snapshot(members, epoch)
            decision = self.decide(members, chain_root(trial), epoch)
            return self.resume_for(members[decision.member], trial, decision)
        return None

    def at_end(self, paused: list[FrozenTrial]) -> list[tuple[int, str, dict[str, str]]]:
        """Members still paused when nothing can run (the epoch budget, a member that never came back)."""
        return [(t.number, "PRUNED", {"hpolab.stop_reason": "pbt_not_resumed",
                                      "hpolab.pbt_paused_at_epoch": str((paused_at(t) or {}).get("epoch"))}) for t in paused]

    # ---------------------------------------------------------------- the decision

    def ready(self, members: dict[int, Member], epoch: int) -> bool:
        """Boundary `epoch` is decided once the whole population started and every member still alive reached it."""
        if len(members) < self.population:
            return False
        return all(m.value_at(epoch) is not None or not m.alive for m in members.values())

    def decide(self, members: dict[int, Member], root: int, epoch: int) -> Decision:
        reached = [m for m in members.values() if m.value_at(epoch) is not None]
        ranked = sorted(reached, key=lambda m: (-score(m.value_at(epoch), self.maximize), m.root))  # ties: the earlier member
        n = len(ranked)
        k = min(math.ceil(n * self.quantile), n // 2)  # the quantile's size (Ray Tune's rule)
        bottom = {m.root for m in ranked[n - k:]} if k else set()
        donors = [m for m in ranked[:k] if self.snapshot_path(m.root, epoch).is_file()]
        member = members[root]
        own = self.config_of(member)
        if root not in bottom or not donors:
            return Decision(root, epoch, None, own, {key: self.value_of(own, key) for key in self.mutations})
        rng = random.Random(f"{self.seed}:{root}:{epoch}")  # the same decision on every worker and re-run
        donor = rng.choice(donors)
        config = self.config_of(donor)
        values = {key: explore(self.value_of(config, key), mutation, self.distribution(donor, key), self.resample_probability, rng)
                  for key, mutation in sorted(self.mutations.items())}
        return Decision(root, epoch, donor.root, {**config, **values}, values)

    def config_of(self, member: Member) -> dict[str, Any]:
        """The member's config keys set per trial: its sampled params, then the changes applied since."""
        return {**member.latest.params, **member.user_attr(CHANGES_ATTR, {})}

    def value_of(self, config: dict[str, Any], key: str) -> Any:
        if key in config:
            return config[key]
        section, name = key.split(".", 1)
        if section == "trainer":
            return self.spec.trainer_dict()[name]
        values = getattr(self.spec, section)
        if name in values:
            return values[name]
        from hpolab.config.experiment import load_experiment

        experiment = load_experiment(self.spec.experiment, self.spec.project_dir)
        return getattr(experiment, f"{section.upper()}_DEFAULTS")[name]

    @staticmethod
    def distribution(member: Member, key: str) -> Any:
        return member.latest.distributions.get(key)

    # ---------------------------------------------------------------- checkpoints and records

    def trial_dir(self, number: int) -> Path:
        return self.stores.trial_dir(self.spec.name, number) if self.stores is not None else Path(f"trial-{number}")

    def snapshot_path(self, root: int, epoch: int) -> Path:
        return self.trial_dir(root) / snapshot_name(epoch)

    def snapshot(self, members: dict[int, Member], epoch: int) -> None:
        """Each member paused at `epoch`: its last.pt kept as pbt_epoch_<epoch>.pt and its best.pt as
        pbt_epoch_<epoch>_best.pt (once; before any of them resumes and overwrites them)."""
        todo = []
        for m in members.values():
            info = paused_at(m.latest)
            target = self.snapshot_path(m.root, epoch)
            folder = self.trial_dir(m.latest.number)
            if info and info.get("epoch") == epoch and not target.exists() and (folder / "last.pt").is_file():
                todo.append((folder, target))

        def copy() -> None:
            for folder, target in todo:
                if (folder / "best.pt").is_file():
                    copy_whole(folder / "best.pt", best_beside(target))
                copy_whole(folder / "last.pt", target)  # last: its presence says the pair is complete

        if todo:
            lifecycle.boundary_decided(copy)

    def tidy(self, members: dict[int, Member]) -> None:
        """Delete the boundary copies no member can take any more: those below the lowest epoch a member
        still alive is at (paused there, or trained to). At the end (none alive) all of them go."""
        alive = [m for m in members.values() if m.alive]
        lowest = min((last_reported(m.latest) for m in alive), default=math.inf)
        if lowest == self._tidied_below:  # (asked on every claim: no copy below it has been made since the last look)
            return
        self._tidied_below = lowest
        for m in members.values():
            for path in self.trial_dir(m.root).glob("pbt_epoch_*.pt"):
                epoch = path.stem.removeprefix("pbt_epoch_").removesuffix("_best")
                if epoch.isdigit() and int(epoch) < lowest:
                    path.unlink(missing_ok=True)

    def exploit(self, d: Decision, own: Path) -> None:
        """Its own last.pt takes the donor's weights and training state (a retry of the coming segment,
        its driver killed before the next epoch's checkpoint, resumes the exploit, not the member's old
        weights), and keeps the member's own record: its history, its best value and epoch, with its own
        best.pt. A member is one trial and one run: its value, best epoch and model are what its run
        logged (study check links its model to its own best epoch), not the donor's."""
        donor = self.snapshot_path(d.donor, d.epoch)
        if not keeps_own_record(donor, own):  # (a checkpoint of another format: the donor's, whole)
            copy_whole(donor, own)
            donor_best, best = best_beside(donor), own.with_name("best.pt")
            if donor_best.is_file():
                copy_whole(donor_best, best)
            else:
                best.unlink(missing_ok=True)

    def resume_for(self, member: Member, trial: FrozenTrial, d: Decision) -> Resume:
        schedule = {str(k): dict(v) for k, v in member.user_attr(SCHEDULE_ATTR, {}).items()}
        if not schedule:  # its first boundary: the values it started with
            before = self.config_of(member)
            schedule["1"] = {key: self.value_of(before, key) for key in self.mutations}
        schedule[str(d.epoch + 1)] = dict(d.values)
        parents = [p for p in member.user_attr(PARENTS_ATTR, []) if not p.endswith(f"@{d.epoch}")]
        if d.donor is not None:
            parents.append(f"{d.donor}@{d.epoch}")
        tags = {PARENTS_TAG: ",".join(parents), EXPLOITED_TAG: parents[-1]} if parents else {}
        own = self.trial_dir(trial.number) / "last.pt"
        if d.donor is not None:
            lifecycle.exploit_copied(lambda: self.exploit(d, own))
        checkpoint = own  # (an exploit made it the donor's weights with the member's own record)
        # An exploit takes the donor's whole configuration (a searched model width must fit its checkpoint).
        changes = d.config if d.donor is not None else {}
        metrics = {METRIC_PREFIX + k: float(v) for k, v in d.values.items() if isinstance(v, (int, float))}
        # The member's records go on the paused attempt it resumes as (the driver writes them; rewriting is harmless).
        attrs = {SCHEDULE_ATTR: schedule, PARENTS_ATTR: parents}
        source = self.snapshot_path(d.donor, d.epoch) if d.donor is not None else None
        return Resume(number=trial.number, checkpoint=checkpoint, config_changes=changes, attrs=attrs, tags=tags, params=metrics,
                      source=source)


OWN_RECORD = ("history", "best_value", "best_epoch")  # a checkpoint's record of its own run (checkpoint.py)


def keeps_own_record(donor: Path, own: Path) -> bool:
    """Write own = the donor's checkpoint with `own`'s record (OWN_RECORD, and the routine's early
    stopping state); False when either is not the training routine's checkpoint (own missing, or an
    own loop's state), nothing written."""
    from hpolab.train.checkpoint import atomic_write_bytes, load_checkpoint, serialize_checkpoint

    if not own.is_file():
        return False
    theirs, mine = load_checkpoint(donor, map_location="cpu"), load_checkpoint(own, map_location="cpu")
    states = [c.get("state") for c in (theirs, mine)]
    if not all(k in theirs and k in mine for k in OWN_RECORD) or not all(isinstance(s, dict) and "early_stopping" in s for s in states):
        return False
    record = {k: mine[k] for k in OWN_RECORD}
    atomic_write_bytes(serialize_checkpoint({**theirs, **record, "state": {**states[0], "early_stopping": states[1]["early_stopping"]}}), own)
    return True


def best_beside(snapshot: Path) -> Path:
    return snapshot.with_name(snapshot.stem + "_best.pt")


def copy_whole(source: Path, target: Path) -> None:
    """Whole or absent: a copy killed half-way leaves no file under the target's name."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(source, partial)
    os.replace(partial, target)


def schedule_of(member: Member) -> list[tuple[int, dict[str, Any]]]:
    """A member's schedule, (first epoch, {key: value}) by epoch: what `hpolab reproduce` replays ([]:
    it never passed a boundary)."""
    return sorted((int(k), dict(v)) for k, v in member.user_attr(SCHEDULE_ATTR, {}).items())
