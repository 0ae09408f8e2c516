"""promote's race step, between picking the challenger and the held-out gate (registry/race.py is
the race): whether to race (--no-race, --race-top, --race-seeds, the spec's `promotion:`), the
study's spec for its trials, the table, and the challenger the race yields: the winner's seed run
nearest its mean (race.py RaceResult.model_seed says why that one).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from hpolab.errors import UserError
from hpolab.registry.champion import TAG_TRIAL_RUN
from hpolab.registry.gate import REFUSE, Decision

PROMOTION_ATTR = "hpolab.promotion"  # Optuna study user attr: the spec's `promotion:` as the latest driver ran it


def race_settings(args, study) -> tuple[bool, int, int]:
    """(race?, top k, seed budget): the options, else the spec's `promotion:` (as the study's latest
    driver recorded it; the defaults for a study run before it was recorded)."""
    from hpolab.config.controls import Promotion

    recorded = study.user_attrs.get(PROMOTION_ATTR)
    p = Promotion(**recorded) if recorded else Promotion()
    top = getattr(args, "race_top", None) or p.race_top
    seeds = getattr(args, "race_seeds", None) or p.race_seeds
    if top < 1:
        raise UserError(f"--race-top {top}: race at least 1 trial (with the champion's configuration, 2 candidates)")
    if seeds < 2:
        raise UserError(f"--race-seeds {seeds}: a race needs at least 2 seeds per candidate (a spread to test with)")
    return (p.race and not getattr(args, "no_race", False)), top, seeds


def recorded_spec(client, study, info):
    """The study's spec as its parent run recorded it (spec.yaml, or the latest accepted spec-<n>.yaml),
    checked here: the race's trial processes import its experiment from this project."""
    import mlflow.artifacts
    import yaml

    from hpolab.config.spec import spec_from_mapping
    from hpolab.errors import SpecError

    version = int(study.user_attrs.get("hpolab.spec_version") or 0)
    name = "spec.yaml" if not version else f"spec-{version}.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(run_id=info.parent_run_id, artifact_path=name, dst_path=tmp,
                                                       tracking_uri=client.tracking_uri)
        except Exception as e:  # noqa: BLE001
            raise UserError(f"race: study {info.name!r} has no recorded {name} on its parent run ({e}); promote with --no-race") from e
        raw = yaml.safe_load(Path(path).read_text())
    try:
        return spec_from_mapping(raw, f"{name} of study {info.name}", search_from=Path.cwd())
    except SpecError as e:
        raise UserError(f"race: the study's recorded spec cannot run here ({'; '.join(e.problems)}); the race trains in trial "
                        f"processes that import experiment {info.experiment}: run promote from the study's project or "
                        "give its spec file (hpolab promote studies/NAME.yaml), or promote with --no-race") from None


def race_step(args, client, stores, study, info, ch, holder, *, command: bool):
    """(the challenger, None) to go on to the gate, or (None, a Decision) when the race ends the promotion."""
    from hpolab.registry import race as race_mod
    from hpolab.registry import race_record
    from hpolab.registry.race_table import print_race

    if getattr(args, "no_race", False):
        return ch, None
    if args.metric and args.metric != info.metric:
        print(f"race: not run: --metric {args.metric} picks by another metric than the one the trials were trained and "
              f"the race compares on ({info.metric}); use --no-race to say so")
        return ch, None
    enabled, top, n_seeds = race_settings(args, study)
    if not enabled:
        return ch, None
    seed = int((study.user_attrs.get("hpolab.spec") or {}).get("seed", 0))  # the study's training seed
    plan = race_mod.plan_race(client, stores, study, info, seed, top, n_seeds, getattr(args, "pick", None), holder)
    if plan is None:
        return ch, None
    print(race_mod.budget_line(plan, study))
    if args.dry_run:
        print("dry run: the race is not run (it trains and records runs); the gate below judges the plain pick")
        return ch, None
    # The study's spec, checked before anything is written (its experiment must import here); a finished
    # race is read back without it.
    spec = None if race_record.finished(client, info, plan.key) else recorded_spec(client, study, info)
    result = race_mod.run_race(plan, client, stores, study, info, lambda: spec or recorded_spec(client, study, info),
                               command=command, pick=getattr(args, "pick", None))
    print_race(result)
    won = result.candidate(result.winner)
    model_run = result.runs[won.label][result.model_seed()]
    if won.champion is not None and holder.tags.get(TAG_TRIAL_RUN) != model_run:  # (the alias holds this race's model: the gate says so)
        return None, Decision(REFUSE, f"REFUSED: the champion's configuration ({won.shown}) wins the race: "
                                      f"@{args.alias} stays at version {won.champion}. Nothing changed; --no-race promotes the plain pick.")
    return winner_challenger(ch, result, won, info), None


def winner_challenger(ch, result, won, info):
    """The challenger the gate judges: the winner's seed run nearest its mean, with the race attached."""
    from hpolab.registry.selection import Challenger

    seed = result.model_seed()
    s = result.standings[won.label]
    run_id = result.runs[won.label][seed]
    values = {m: per[seed] for m, per in result.objectives.get(won.label, {}).items()}
    print(f"race winner: {won.label}; its registered model: the seed-{seed} run {run_id} ({info.metric} {s.values[seed]:.4f}, "
          f"the seed nearest its mean {s.mean:.4f})")
    out = Challenger(won.trial_number, run_id, s.mean, s.values[seed], values=values,
                     why=(ch.why and f"{ch.why}; race: {result.why}") or "", bounds=ch.bounds)
    return replace(out, race=(result, won.label, seed))


def tag_version(client, model_name: str, ch) -> None:
    """The registered version carries the race that chose its model (race_record.version_tags)."""
    from hpolab.registry.champion import existing_version
    from hpolab.registry.race_record import version_tags

    version = existing_version(client, model_name, ch.run_id)
    if version is None:
        return
    result, label, seed = ch.race
    for k, v in version_tags(result, label, seed, ch.run_id).items():
        if version.tags.get(k) != v:
            client.set_model_version_tag(model_name, version.version, k, v)
