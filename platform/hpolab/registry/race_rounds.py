"""A promotion race's rounds: queue the seed trials a round needs, let the driver run them, read the
results, drop who the paired test drops, record the round (registry/race.py says why it is built so).

The race's spec is the study's (its `parallel`, `trial_timeout`, retries, device placement) with
what a race must not have: no search space (each seed trial brings its whole config), no pruner (a
pruned seed run is no measurement), no trial scheduler, no LR range test, no enqueue or warm start,
no stop rules. Every seed run keeps its checkpoints (the winner's best.pt is what promote rebuilds),
and logs its model where promote registers the trial's logged model (candidate.registers_logged_model).
"""

from __future__ import annotations

import signal
from typing import Any

from optuna.trial import TrialState

from hpolab.registry.race_stats import drops_after, noise_floor, round_seeds, rounds_of, summarise
from hpolab.study.sampling.seed_trials import CANDIDATE, SEED, queue_seed_trial


class RaceInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped the race's trials (resumable): `signum` says which."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


def companion_spec(spec, name: str, n_trials: int, logged_model: bool):
    """The study's spec as the race's driver runs it (module docstring)."""
    from hpolab.config.spec import LRRangeTestSpec, Named
    from hpolab.config.trial_scheduler import Budget

    race = spec.model_copy(update={
        "name": name, "n_trials": n_trials, "timeout": None, "search_space": {}, "enqueue": [], "warm_start": None,
        "lr_range_test": LRRangeTestSpec(), "sampler": Named(type="random"), "pruner": Named(type="none"),
        "trial_scheduler": None, "budget": Budget(), "stop_after_no_improvement": None,
        "stop_when_converged": None, "noise_probe": None,
        "log_models": "complete" if logged_model else "none", "keep_checkpoints": "all"})
    race._project_dir = spec.project_dir
    return race


def pairs(companion) -> dict[tuple[str, int], list]:
    """(candidate, seed) -> its seed trials (a retried attempt and its copy: both)."""
    out: dict[tuple[str, int], list] = {}
    for t in companion.get_trials(deepcopy=False):
        if t.user_attrs.get(CANDIDATE) is not None and t.user_attrs.get(SEED) is not None:
            out.setdefault((t.user_attrs[CANDIDATE], int(t.user_attrs[SEED])), []).append(t)
    return out


def queue(companion, storage, result, wanted: list[tuple[str, int]]) -> int:
    """Queue the wanted (candidate, seed) pairs the companion lacks, under its budget lock; how many
    pairs it holds now (the driver's n_trials: each pair ends as one counted trial)."""
    from hpolab.stores.budget_lock import budget_lock

    with budget_lock(storage, companion.study_name):
        have = pairs(companion)
        for label, seed in wanted:
            if (label, seed) not in have:
                queue_seed_trial(companion, seed, config=result.candidate(label).config, user_attrs={CANDIDATE: label})
        return len(pairs(companion))


def outcomes(companion, info) -> dict[tuple[str, int], tuple[str, Any, Any]]:
    """(candidate, seed) -> ("ok", value, trial) | ("failed", reason, trial); pairs still to run are absent."""
    from hpolab.registry.pick import values_of
    from hpolab.stores.trial_states import retried_numbers

    trials = companion.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    out: dict[tuple[str, int], tuple[str, Any, Any]] = {}
    for pair, ts in pairs(companion).items():
        done = [t for t in ts if t.state == TrialState.COMPLETE]
        if done:
            t = done[0]
            out[pair] = ("ok", values_of(t, info.objectives) if info.objectives else t.value, t)
            continue
        final = [t for t in ts if t.state in (TrialState.FAIL, TrialState.PRUNED) and t.number not in retried]
        if final:
            out[pair] = ("failed", f"trial {final[0].number} of {companion.study_name} ended {final[0].state.name}", final[0])
    return out


def drive(result, companion, stores, spec, n_trials: int, command: bool) -> None:
    """The driver on the race's spec until its n_trials: the round's seed trials run, like any trials."""
    from hpolab.errors import StudyError
    from hpolab.registry.evaluation import PromotionFailed
    from hpolab.study.driver.progress import Progress
    from hpolab.study.driver.run import run_checked

    from hpolab.config.experiment import load_experiment
    from hpolab.registry.candidate import registers_logged_model

    race_spec = companion_spec(spec, companion.study_name, n_trials, registers_logged_model(load_experiment(spec.experiment)))
    try:
        outcome = run_checked(race_spec, stores, Progress(race_spec, summary=False), allow_spec_change=True, command=command)
    except StudyError as e:
        raise PromotionFailed(f"the race could not run its seed trials: {e}") from e
    if outcome.signal is not None:
        name = "SIGTERM" if outcome.signal == signal.SIGTERM else "Ctrl-C"
        raise RaceInterrupted(outcome.signal, f"the race was interrupted by {name}; re-run the same promote to resume it")
    if outcome.failure_limit:
        raise PromotionFailed(f"the race stopped: {outcome.failure_limit}; nothing was registered")


def play(result, companion, storage, client, stores, spec_of, info, *, command: bool) -> None:
    """Every round: queue, run what is missing, read, drop, record."""
    from hpolab.registry import race_record
    from hpolab.registry.evaluation import PromotionFailed

    seeds_all = result.plan.seeds
    for rnd in range(1, rounds_of(len(seeds_all)) + 1):
        racing = [c for c, s in result.standings.items() if s.racing]
        if len(racing) < 2:
            break
        seeds = round_seeds(seeds_all, rnd)
        wanted = [(c, s) for c in racing for s in seeds]
        n_trials = queue(companion, storage, result, wanted)
        found = outcomes(companion, info)
        if any(p not in found for p in wanted):
            print(f"race round {rnd}: {sum(p not in found for p in wanted)} seed runs to train "
                  f"({len(racing)} candidates x seeds {', '.join(map(str, seeds))})")
            drive(result, companion, stores, spec_of(), n_trials, command)
            found = outcomes(companion, info)
        missing = [p for p in wanted if p not in found]
        if missing:
            raise PromotionFailed(f"the race's seed runs {', '.join(f'{c} seed {s}' for c, s in missing)} did not finish; "
                                  "re-run promote to resume the race")
        _read(result, found, wanted)
        result.rounds = rnd
        if not info.objectives:
            for label, p in drops_after({c: result.standings[c].values for c in racing if result.standings[c].racing},
                                        [c for c in racing if result.standings[c].racing], seeds, info.direction).items():
                result.standings[label].dropped_after, result.standings[label].p_value = rnd, p
        summarise(result.standings, info.direction, seeds_all)
        result.noise, result.dof = noise_floor({c: s.values for c, s in result.standings.items()})
        race_record.record_round(client, result.run_id, result.standings, result.plan.keys, info.metric, rnd, result.noise)
        _print_round(result, rnd)


def _read(result, found: dict, wanted: list[tuple[str, int]]) -> None:
    """The round's results into the standings: each seed's value (several objectives: the pruned-on
    metric's, and every objective's apart), each run; a failed seed run ends its candidate's race."""
    for label, seed in wanted:
        kind, value, trial = found[(label, seed)]
        s = result.standings[label]
        result.runs.setdefault(label, {})[seed] = trial.user_attrs.get("mlflow_run_id", "")
        if kind == "failed":
            s.failed = s.failed or f"seed {seed}: {value}"
        elif isinstance(value, dict):
            s.values[seed] = float(value[result.metric])
            for m, v in value.items():
                result.objectives.setdefault(label, {}).setdefault(m, {})[seed] = float(v)
        else:
            s.values[seed] = float(value)


def _print_round(result, rnd: int) -> None:
    dropped = [f"{c} (p={s.p_value:.3f})" for c, s in result.standings.items() if s.dropped_after == rnd]
    failed = [f"{c}: {s.failed}" for c, s in result.standings.items() if s.failed]
    left = [c for c, s in result.standings.items() if s.racing]
    print(f"race round {rnd}: {len(left)} still racing ({', '.join(left)})"
          + (f"; dropped: {', '.join(dropped)}" if dropped else "") + (f"; failed: {'; '.join(failed)}" if failed else ""))


def decide(result, companion, info, pick: str | None) -> None:
    """The winner (one objective: the best mean of those left; several: the pick rule on the means) and
    the epochs the race trained."""
    from hpolab.registry.evaluation import PromotionFailed
    from hpolab.stores.trial_counts import epochs_used

    result.epochs = epochs_used([t for ts in pairs(companion).values() for t in ts])
    if info.objectives:
        from hpolab.registry.race_front import front_winner

        result.winner, result.why = front_winner(result, info, pick)
    else:
        result.winner = summarise(result.standings, info.direction, result.plan.seeds)
    if result.winner is None:
        raise PromotionFailed("every candidate of the race failed; see `hpolab study status "
                              f"{companion.study_name}` for its seed trials; nothing was registered")
