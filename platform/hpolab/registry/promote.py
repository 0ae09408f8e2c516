"""`hpolab promote NAME`: the best COMPLETE trial -> held-out test gate -> registry version + alias + exports.

Steps (everything that can refuse or fail runs before anything is written):

1. Pick the best COMPLETE trial by the study metric and direction (or `--metric`, read at each trial's
   best-checkpoint epoch). Pruned and failed trials are never candidates.
   Then, unless `--no-race` (or the spec's `promotion: {race: false}`), race the top `--race-top`
   trials (and the champion's configuration) on fresh paired seeds (race.py; promote_race.py): the
   race's winner replaces the pick, its seed run nearest its mean is the model the next steps judge
   and register, and its registered version carries the race's result as tags. The champion's
   configuration winning the race ends the promotion (exit 3: nothing is better than the champion).
2. Its model, scored on held-out data no trial saw (trials select on val), as its experiment allows
   (candidate.py): by the experiment's `evaluate(model, "test")` (the trial's logged model, as it loads),
   or by its task on the raw **test** split (rebuilt from `checkpoints/best.pt`, wrapped with the
   experiment's preprocessing: `serving.ServingModel`, raw inputs in). Neither: exit 2 unless --force,
   which registers the trial's logged model ungated.
3. The current holder of the alias, scored the same way (the same evaluate(), or the same test split:
   same fingerprint of inputs and labels), else the two are not comparable. The challenger must be
   strictly better on the gate metric (test_acc for val_acc, test_loss for val_loss, ...; an exact tie
   is decided by test_loss, or test_acc for a loss gate) unless `--force`; otherwise exit 3 and
   nothing is written. Several objectives: every objective is checked (gate_objectives.py): the holder
   must not be at least as good on all of them, and the --pick rule's bounds must hold on the test values.
4. Export ONNX (dynamic batch axis) and TorchScript to a temporary folder, each checked against
   PyTorch (max abs output difference within 1e-4): the serving model on the test inputs, where a
   failure is exit 1; a logged model on its input example, where a failure skips them with the reason.
   `--dry-run` stops here: it prints what would happen, writes nothing, and exits with the code the
   real run would (0, or 3 when refused).
5. Write: a run `promote-trial-<n>` nested under the study's parent run holds the exports and the test
   metrics (and the serving model: an MLflow LoggedModel, torch.export "pt2" format, raw-input
   signature). A new version of the registered model is created from the serving model (or the
   trial's logged model itself), tagged with its lineage, and the alias moves to it.

Where the steps live: selection.py (1: the challenger), promote_race.py (1: the race), candidate.py
(2-5: what differs between experiments), evaluation.py (2: the test split; 4: the exports), champion.py
(3: the alias holder), gate.py (3: the decision, a pure function), writer.py (5).
This module is the command: `promote` runs the steps top to bottom.

Idempotent: a version whose tag hpolab.trial_run_id names the same trial run is reused (the alias
moves to it if it wins), never duplicated; if it already holds the alias there is nothing to do.
"""

from __future__ import annotations

import re
import signal
import tempfile
from dataclasses import replace
from pathlib import Path

from hpolab.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED
from hpolab.registry.evaluation import PromotionFailed
from hpolab.stores.paths import Stores

ALIAS_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def promote_cmd(args, stores: Stores) -> int:
    from hpolab.registry.race_rounds import RaceInterrupted
    from hpolab.study.trials.trial_forkserver import allow_fork

    allow_fork()  # the race's forkserver may be a fork of this command's process (as `study run`'s is)
    try:
        return promote_study(args.name, stores, metric=args.metric, pick=getattr(args, "pick", None), model_name=args.model_name,
                             alias=args.alias, force=bool(args.force), dry_run=bool(args.dry_run), race=not args.no_race,
                             race_top=args.race_top, race_seeds=args.race_seeds, command=True)
    except PromotionFailed as e:
        print(f"hpolab promote: FAILED: {e}")
        return EXIT_FAILED
    except RaceInterrupted as e:
        print(f"hpolab promote: {e}")
        return EXIT_TERMINATED if e.signum == signal.SIGTERM else EXIT_INTERRUPTED


def promote_study(name: str, stores: Stores, *, metric: str | None = None, pick: str | None = None, model_name: str | None = None,
                  alias: str = "champion", force: bool = False, dry_run: bool = False, race: bool = True,
                  race_top: int | None = None, race_seeds: int | None = None, command: bool = False) -> int:
    """`hpolab promote NAME` with its options (the CLI and hpolab's Study.promote): the exit code, 0 or
    EXIT_REFUSED (3) when the gate refuses; UserError for bad input, PromotionFailed (exit 1),
    race.RaceInterrupted after Ctrl-C or SIGTERM during the race (re-run to resume it). `race`,
    `race_top`, `race_seeds`: --no-race, --race-top, --race-seeds (None: the spec's `promotion:`).
    `command`: this is the `hpolab` command's own process."""
    import argparse

    from hpolab.errors import UserError

    if not ALIAS_RE.match(alias) or alias == "latest" or re.fullmatch(r"v\d+", alias):
        raise UserError(f"--alias {alias!r}: use letters, digits, '_' or '-' (not 'latest' or v<number>, which MLflow reserves)")
    args = argparse.Namespace(name=name, metric=metric, pick=pick, model_name=model_name, alias=alias, force=force, dry_run=dry_run,
                              stores=stores,  # (the hints it prints name the stores)
                              no_race=not race, race_top=race_top, race_seeds=race_seeds)
    watch = None if dry_run else ChampionWatch(name, stores, model_name or name, alias)
    code = promote(args, stores, command=command)
    if watch is not None and code == EXIT_OK:
        watch.notify()
    return code


class ChampionWatch:
    """champion_changed for the study's notification targets (study/driver/notify.py), when the alias moved."""

    def __init__(self, name: str, stores: Stores, model_name: str, alias: str):
        from hpolab.registry.champion import alias_holder
        from hpolab.stores.mlflow_runs import client_for
        from hpolab.stores.optuna_storage import open_storage

        self.name, self.stores, self.model_name, self.alias = name, stores, model_name, alias
        self.storage, self.study_id, self.attrs = open_storage(stores.optuna_url), None, {}
        try:
            self.study_id = self.storage.get_study_id_from_name(name)
            self.attrs = self.storage.get_study_user_attrs(self.study_id)
        except KeyError:  # (promote says so itself)
            pass
        self.client = client_for(stores) if self.attrs.get("hpolab.notify") else None
        self.before = alias_holder(self.client, model_name, alias) if self.client is not None else None

    def notify(self) -> None:
        from hpolab.registry.champion import alias_holder
        from hpolab.registry.writer import TAG_TRIAL
        from hpolab.study.driver.notify import send_once

        after = alias_holder(self.client, self.model_name, self.alias) if self.client is not None else None
        if after is None or (self.before is not None and self.before.version == after.version):
            return
        send_once(self.name, self.stores, self.attrs, "champion_changed", {
            "model": self.model_name, "alias": self.alias, "version": int(after.version), "run_id": after.run_id,
            "trial": int(after.tags[TAG_TRIAL]) if after.tags.get(TAG_TRIAL, "").isdigit() else None,
            "previous_version": int(self.before.version) if self.before is not None else None,
            "model_uri": f"models:/{self.model_name}@{self.alias}"}, self.storage, self.study_id)


def promote(args, stores: Stores, command: bool = False) -> int:
    """Steps 1-5 of the module docstring; returns the exit code (EXIT_REFUSED when the gate refuses)."""
    import mlflow

    from hpolab.registry import champion, promote_race, selection
    from hpolab.stores.mlflow_runs import client_for

    client = client_for(stores)
    mlflow.set_tracking_uri(stores.tracking_uri)  # the fluent model APIs resolve their client from it

    # 1. the challenger (the race's winner, when it races), and whether its version already holds the alias
    study, info = selection.load_study(args.name, stores, client)
    metric, direction = selection.selection_metric(args.metric, info)
    ch = _challenger(args, client, study, info, metric, direction)
    holder = champion.alias_holder(client, args.model_name or args.name, args.alias)
    ch, ended = promote_race.race_step(args, client, stores, study, info, ch, holder, command=command)
    if ended is not None:
        print(ended.reason)
        return ended.exit_code
    code = _gate_and_write(args, stores, client, study, info, metric, ch, holder)
    if code == EXIT_OK and ch.race is not None and not args.dry_run:
        promote_race.tag_version(client, args.model_name or args.name, ch)
    return code


def _gate_and_write(args, stores: Stores, client, study, info, metric: str, ch, holder) -> int:
    """Steps 2-5 for the challenger: its model on held-out data, the gate, the exports, the writes; how
    each is done is what the experiment provides (candidate.py), the steps are the same for every one."""
    from hpolab.registry import candidate, champion, gate, selection, writer

    model_name, alias, dry = args.model_name or args.name, args.alias, bool(args.dry_run)
    existing = champion.existing_version(client, model_name, ch.run_id)
    contest = gate.Contest(model_name, alias, ch.trial_number, info.name,
                           champion_version=holder.version if holder is not None else None,
                           challenger_version=existing.version if existing is not None else None)
    already = gate.already_champion(contest)
    if already is not None:
        print(already.reason)
        return already.exit_code

    with tempfile.TemporaryDirectory(prefix="hpolab-promote-") as tmp_name:
        tmp = Path(tmp_name)
        exp = selection.challenger_experiment(client, info, ch, client.get_run(ch.run_id))
        scored = candidate.load(client, stores, info, ch, exp, tmp, bool(args.force))  # 2. on held-out data
        decision, gate_name = _decide(args, study, info, metric, ch, scored, holder, contest)  # 3. the gate
        print(decision.reason)
        if not decision.promote:
            return decision.exit_code

        previous = holder.version if holder is not None else None
        if existing is not None:  # idempotent: this trial already has a version (with its exports)
            return writer.move_to_existing(client, model_name, alias, existing.version, previous, ch.trial_number, ch.run_id, dry)

        exports, skipped = scored.export(tmp)  # 4. exports + parity, still nothing written
        if dry:
            print(f"dry run: would register {scored.registers.format(model=model_name)} and move @{alias} to it "
                  f"(from {previous or 'nobody'}); nothing was written")
            return EXIT_OK

        # 5. the writes
        version = scored.write(client, model_name, alias, info, ch, gate_name, args.metric or info.metric, exports, skipped, previous)
    print(f"registered {model_name} version {version}{scored.label}; @{alias} -> version {version}"
          + (f" (was version {previous})" if previous else ""))
    print(f'load it: {scored.loader}.load_model("models:/{model_name}@{alias}")  '
          f"or  {stores.command(f'predict models:/{model_name}@{alias} INPUT.npy')}{scored.note}")
    return EXIT_OK


def _decide(args, study, info, metric: str, ch, scored, holder, contest):
    """(the gate's decision, the gate metric or None): the challenger's test metrics against the alias
    holder's, scored the same way; prints them."""
    from hpolab.registry import gate

    if scored.metrics is None:  # nothing can score it: only --force comes here (candidate.Logged)
        return gate.Decision(gate.PROMOTE, f"experiment {info.experiment} has no evaluate(model, split): --force registers "
                                           "the trial's logged model ungated (no test metrics)"), None
    test = scored.metrics
    gate_name = gate.gate_metric((metric, info.metric), test) or "loss"  # (a task's evaluation always has its loss)
    held, why_not = scored.holder_metrics(holder, contest.model, info, ch, gate_name) if holder is not None else (None, None)
    scored.print_table(info, ch, contest.alias, holder, held)
    contest = replace(contest, not_comparable=why_not)
    if info.objectives:
        return _gate_every_objective(study, info, ch, test, holder, held, bool(args.force), contest), gate_name
    directions = gate.directions(test, gate_name, scored.declared, info.direction)
    return gate.decide(test, held, gate_name, bool(args.force), contest, directions, prefix=scored.prefix(gate_name)), gate_name


def _challenger(args, client, study, info, metric: str, direction: str):
    from hpolab.errors import UserError
    from hpolab.registry import selection

    pick = getattr(args, "pick", None)
    if info.objectives:  # several objectives: a stated rule, else the front's knee
        if args.metric:
            raise UserError(f"--metric: study {info.name!r} has several objectives ({', '.join(info.objectives)}); "
                            "state the choice with --pick, e.g. --pick \"max val_acc\" or --pick \"val_acc>=0.95; min latency_ms\"")
        return selection.pick_on_front(study, info, pick)
    if pick:
        raise UserError(f"--pick: study {info.name!r} has one objective ({info.metric}); use --metric to pick by another metric")
    return selection.pick(client, study, info, metric, direction)


def _gate_every_objective(study, info, ch, test: dict, holder, held: dict | None, force: bool, contest):
    """The decision on every objective; prints each one's gate value for the challenger and the holder."""
    from hpolab.registry import gate_objectives as go

    directions = {n: d.name.lower() for n, d in zip(info.objectives, study.directions)}
    ch.gate_values = go.gate_values(info.objectives, test, ch.values)
    theirs = go.holder_values(info.objectives, held, holder.tags) if holder is not None else None
    print("every objective (epoch metrics on the test split; cost metrics as each trial measured them):")
    for name, d in directions.items():
        mine = ch.gate_values.get(name)
        other = (theirs or {}).get(name)
        print(f"  {name:>14s} ({d}): challenger {'-' if mine is None else f'{mine:.4g}'}"
              + (f", {contest.alias} {'-' if other is None else f'{other:.4g}'}" if holder is not None else ""))
    bound_values = go.gate_values([m for m, _, _ in ch.bounds], test, ch.values)  # constrained metrics too
    return go.decide(ch.gate_values, theirs, directions, ch.bounds, force, contest, bound_values)
