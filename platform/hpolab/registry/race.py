"""A promotion race: the study's leaders retrained on fresh, paired seeds before the held-out gate.

Every trial of a study trains on one seed, so the best trial is partly the luckiest seed. Before
promote evaluates anything on the test split, the race retrains its candidates (race_candidates.py:
the top-k trials, and the alias holder's configuration when it came from the same experiment) on the
same fresh seeds, on the train split, scored on the validation split, in rounds; a candidate whose
paired difference to the leader is significant is dropped (race_stats.py: the test and its level);
the race ends when one is left or at its seed budget, and the winner is the best mean.

Where the seed runs live. Each is a trial of the race's companion Optuna study `<study>.race-<key>`
(in the study's storage), a seed trial (study/sampling/seed_trials.py) whose config is the
candidate's with the seed replaced (`data_seed` kept: the splits never move). Its runs sit under the
race's `race` run, under the study's parent run (race_record.py). They are run by the driver itself
(study/driver/run.py `run_checked`, the code `study run` runs): trial processes, `parallel` of them,
retries, heartbeats; a second `hpolab promote` of the same study at the same time joins as a worker.

Resume. Everything the race decides follows from the seed trials' results, deterministically: a
re-run of promote after a kill finds the same race (same candidates and seeds: the same key),
queues what is missing, lets the driver reap and retry the dead trials of the killed one, and
replays the rounds from the results (a round already recorded is not logged again). A finished race
is read back, not trained again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hpolab.registry.race_candidates import Candidate
from hpolab.registry.race_stats import Standing


@dataclass
class Plan:
    study: str
    key: str
    companion: str  # the Optuna study its seed trials are in
    candidates: list[Candidate]
    seeds: list[int]
    top: int

    @property
    def keys(self) -> dict[str, str]:
        return {c.label: c.key for c in self.candidates}


@dataclass
class RaceResult:
    plan: Plan
    run_id: str
    metric: str
    direction: str
    standings: dict[str, Standing]
    directions: list[str] = field(default_factory=list)  # every objective's (one objective: [direction])
    runs: dict[str, dict[int, str]] = field(default_factory=dict)  # label -> seed -> its run id
    objectives: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)  # several: label -> metric -> seed -> value
    winner: str | None = None
    rounds: int = 0
    noise: float | None = None
    dof: int = 0
    epochs: int = 0  # trained by the race's seed trials
    why: str = ""  # several objectives: how the winner was chosen

    @property
    def seeds(self) -> list[int]:
        return self.plan.seeds

    def candidate(self, label: str) -> Candidate:
        return next(c for c in self.plan.candidates if c.label == label)

    def model_seed(self) -> int:
        """The winner's seed whose run becomes the registered model: the one nearest its mean (ties: the
        lower seed). Not the luckiest on val (that would pick on noise again), a typical run of the
        configuration that won."""
        s = self.standings[self.winner]
        return min(s.values, key=lambda seed: (abs(s.values[seed] - s.mean), seed))

    def summary(self) -> dict:
        """race.json: every candidate's seeds, values, runs and standing."""
        def f(v):
            return None if v is None or (isinstance(v, float) and math.isnan(v)) else v

        return {"metric": self.metric, "direction": self.direction, "seeds": self.seeds, "rounds": self.rounds,
                "winner": self.winner, "noise_floor": self.noise, "epochs": self.epochs, "why": self.why,
                "candidates": [{"label": c.label, "trial": c.trial_number, "config_run_id": c.run_id, "params": c.params,
                                "study_value": c.value, "champion_version": c.champion,
                                "values": {str(k): v for k, v in self.standings[c.label].values.items()},
                                "objectives": {m: {str(k): v for k, v in per.items()} for m, per in self.objectives.get(c.label, {}).items()},
                                "runs": {str(k): v for k, v in self.runs.get(c.label, {}).items()},
                                "mean": f(self.standings[c.label].mean), "ci95": [f(x) for x in self.standings[c.label].ci],
                                "p_best": self.standings[c.label].p_best, "dropped_after": self.standings[c.label].dropped_after,
                                "p_value": self.standings[c.label].p_value, "failed": self.standings[c.label].failed}
                               for c in self.plan.candidates]}


def plan_race(client, stores, study, info, study_seed: int, top: int, n_seeds: int, pick: str | None, holder) -> Plan | None:
    """The race's candidates and seeds (None, said why, when fewer than two can race)."""
    from hpolab.registry.race_candidates import candidates_for, race_key, seeds_for

    candidates, notes = candidates_for(client, stores, study, info, top, pick, holder)
    for n in notes:
        print(f"race: {n}")
    if len(candidates) < 2:
        print(f"race: {len(candidates)} candidate{'s' * (len(candidates) != 1)}: nothing to race; promoting by the study's value")
        return None
    seeds = seeds_for(study_seed, n_seeds)
    key = race_key(candidates, seeds, info.metric)
    return Plan(info.name, key, f"{info.name}.race-{key}", candidates, seeds, top)


def budget_line(plan: Plan, study) -> str:
    """One line before the race starts: how many epochs it trains at most, against the study's."""
    from hpolab.registry.race_stats import FIRST_ROUND
    from hpolab.stores.trial_counts import epochs_used

    per_seed = sum(int(c.config["trainer"].get("max_epochs", 0)) for c in plan.candidates)
    most = per_seed * len(plan.seeds)
    least = per_seed * min(FIRST_ROUND, len(plan.seeds))
    used = epochs_used(study.get_trials(deepcopy=False))
    share = f", {most / used:.0%} of the {used} the study trained" if used else ""
    return (f"race: {len(plan.candidates)} candidates x up to {len(plan.seeds)} seeds ({', '.join(map(str, plan.seeds))}; "
            f"paired) will train at most {most} epochs{share} (at least {least}: early stopping and drops end runs "
            f"sooner); --no-race skips it")


def run_race(plan: Plan, client, stores, study, info, spec_of, *, command: bool = False, pick: str | None = None) -> RaceResult:
    """Train the rounds (or read back what a killed or finished race trained); the result, recorded.
    `spec_of()`: the study's StudySpec, asked for only when seed runs are left to train."""
    import optuna

    from hpolab.registry import race_record, race_rounds
    from hpolab.stores.mlflow_runs import EXPERIMENT_ATTR
    from hpolab.stores.optuna_storage import open_storage

    storage = open_storage(stores.optuna_url)
    companion = optuna.create_study(storage=storage, study_name=plan.companion, directions=[d.name.lower() for d in study.directions],
                                    load_if_exists=True)
    if info.objectives and companion.metric_names is None:
        companion.set_metric_names(list(info.objectives))
    companion.set_user_attr(race_record.RACE_OF, info.name)
    companion.set_user_attr(EXPERIMENT_ATTR, info.name)  # its seed runs go in the study's experiment, under the race run
    run_id = race_record.open_race_run(client, info, plan, companion)
    result = RaceResult(plan, run_id, info.metric, info.direction, {c.label: Standing(c.label) for c in plan.candidates},
                        directions=[d.name.lower() for d in study.directions])
    race_rounds.play(result, companion, storage, client, stores, spec_of, info, command=command)
    race_rounds.decide(result, companion, info, pick)
    race_record.name_seed_runs(client, info.experiment_id, run_id, plan.keys)
    race_record.record_result(client, run_id, result, study)
    return result
