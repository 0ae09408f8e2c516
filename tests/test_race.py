"""The promotion race: its statistics on fabricated results, then `hpolab promote` racing a real tiny
study end to end (the race's runs in MLflow, the registered version's tags, `study check`, a SIGKILL
in the middle of the race and the re-run that resumes it).

The study (run once per module with the real CLI) has three enqueued configurations of the digits
CNN for two epochs: one good learning rate and two that learn next to nothing, so the paired test
has something to drop after the first round whatever the seeds draw.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from conftest import run_cli, start_cli

from hpolab.registry import race_stats
from hpolab.registry.race_stats import Standing

NAME = "race-digits"
STUDY = ["name=race-digits", "n_trials=3", "parallel=2", "trainer.max_epochs=2", "trainer.warmup_epochs=0", "pruner={type: none}",
         "sampler={type: random}", "search_space={trainer.lr: {type: float, low: 1.0e-7, high: 3.0e-2, log: true}}",
         "enqueue=[{trainer.lr: 1.0e-2}, {trainer.lr: 1.0e-7}, {trainer.lr: 2.0e-7}]",
         # fewer kept models and checkpoints than the race has candidates: it retrains from the configs
         "log_models={top_k: 1}", "keep_checkpoints={top_k: 1}"]


# ----------------------------------------------------------------------------- statistics (pure)


def test_a_consistently_worse_candidate_is_dropped_a_noisy_one_is_not():
    results = {"a": {1: 0.95, 2: 0.96, 3: 0.94}, "b": {1: 0.90, 2: 0.91, 3: 0.89}, "c": {1: 0.99, 2: 0.85, 3: 0.97}}
    drops = race_stats.drops_after(results, ["a", "b", "c"], [1, 2, 3], "maximize")
    assert set(drops) == {"b"} and drops["b"] < race_stats.ALPHA
    # the same numbers as losses: now "b" leads and "a" is the consistently worse one
    drops = race_stats.drops_after(results, ["a", "b", "c"], [1, 2, 3], "minimize")
    assert set(drops) == {"a"}


def test_the_paired_test_counts_a_gap_without_spread_and_needs_two_seeds():
    assert race_stats.paired_p(np.array([0.9, 0.8]), np.array([0.8, 0.7])) < 1e-9  # the same gap on every seed
    assert race_stats.paired_p(np.array([0.9, 0.8]), np.array([0.9, 0.8])) == 1.0  # no gap
    assert race_stats.paired_p(np.array([0.9, 0.9]), np.array([0.8, 0.8])) == 0.0  # exactly the same gap: no spread
    assert race_stats.paired_p(np.array([0.9]), np.array([0.1])) == 1.0  # one seed: nothing to test
    # against scipy's own paired t-test (one-sided)
    from scipy.stats import ttest_rel

    a, b = np.array([0.91, 0.95, 0.93, 0.96]), np.array([0.90, 0.92, 0.94, 0.93])
    assert race_stats.paired_p(a, b) == pytest.approx(ttest_rel(a, b, alternative="greater").pvalue)


def test_intervals_p_best_winner_and_the_pooled_noise_floor():
    standings = {"a": Standing("a", {1: 0.95, 2: 0.96, 3: 0.94}), "b": Standing("b", {1: 0.90, 2: 0.97, 3: 0.92}),
                 "c": Standing("c", {1: 0.99}, dropped_after=1)}
    winner = race_stats.summarise(standings, "maximize", [1, 2, 3])
    assert winner == "a"  # c's one lucky seed does not win: it was dropped
    assert standings["a"].mean == pytest.approx(0.95)
    low, high = standings["a"].ci
    from scipy.stats import t

    assert (high - low) / 2 == pytest.approx(t.ppf(0.975, 2) * np.std([0.95, 0.96, 0.94], ddof=1) / math.sqrt(3))
    assert math.isnan(standings["c"].ci[0])  # one seed: no interval
    assert sum(s.p_best for s in standings.values()) == pytest.approx(1.0)
    again = {k: Standing(k, dict(s.values), s.dropped_after) for k, s in standings.items()}
    race_stats.summarise(again, "maximize", [1, 2, 3])
    assert {k: s.p_best for k, s in again.items()} == {k: s.p_best for k, s in standings.items()}  # a fixed bootstrap seed
    floor, dof = race_stats.noise_floor({k: s.values for k, s in standings.items()})
    pooled = math.sqrt((np.var([0.95, 0.96, 0.94]) * 3 + np.var([0.90, 0.97, 0.92]) * 3) / 4)
    assert (floor, dof) == (pytest.approx(pooled), 4)


def test_rounds_start_with_three_seeds_and_add_one():
    seeds = [1, 2, 3, 4, 5]
    assert race_stats.rounds_of(5) == 3 and race_stats.rounds_of(2) == 1
    assert [race_stats.round_seeds(seeds, r) for r in (1, 2, 3)] == [[1, 2, 3], [1, 2, 3, 4], seeds]


def test_the_registered_run_is_the_winners_seed_nearest_its_mean():
    from hpolab.registry.race import Plan, RaceResult

    result = RaceResult(Plan("s", "k", "s.race-k", [], [1, 2, 3], 3), "run", "val_acc", "maximize",
                        {"a": Standing("a", {1: 0.90, 2: 0.99, 3: 0.93})}, winner="a")
    race_stats.summarise(result.standings, "maximize", [1, 2, 3])
    assert result.model_seed() == 3  # 0.93 is nearest the mean 0.94, not the luckiest 0.99


# ----------------------------------------------------------------------------- end to end


def _uri(store: Path) -> str:
    return f"sqlite:///{store / 'mlflow.db'}"


def _client(store: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=_uri(store), registry_uri=_uri(store))


@pytest.fixture(scope="module")
def studied(tmp_path_factory, migrated_store) -> Path:
    store = tmp_path_factory.mktemp("race") / "studied"
    store.mkdir()
    for name in ("mlflow.db", "optuna.db"):
        shutil.copy(migrated_store / name, store / name)
    (store / "artifacts").mkdir()
    run_cli("--store", str(store), "study", "run", "studies/digits_cnn.yaml", *STUDY)
    return store


@pytest.fixture
def store(studied, tmp_path) -> Path:
    return Path(shutil.copytree(studied, tmp_path / "store"))


def _companion(store: Path) -> optuna.Study:
    names = [s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{store / 'optuna.db'}")]
    (race,) = [n for n in names if n.startswith(f"{NAME}.race-")]
    return optuna.load_study(study_name=race, storage=f"sqlite:///{store / 'optuna.db'}")


def _check_clean(store: Path) -> None:
    out = run_cli("--store", str(store), "study", "check", NAME)
    assert "Optuna and MLflow agree" in out.stdout


@pytest.mark.slow
def test_promote_races_the_leaders_and_registers_the_winners_seed_run(store):
    out = run_cli("--store", str(store), "promote", NAME, "--race-seeds", "4").stdout
    assert "race: 3 candidates x up to 4 seeds (1, 2, 3, 4; paired) will train at most 24 epochs" in out
    for column in ("candidate", "params", "seeds", "val_acc mean ± CI", "P(best)", "dropped"):
        assert column in out
    assert out.count("after round 1 (p=") == 2  # the two configurations that learn nothing
    assert "registered race-digits version 1" in out

    c = _client(store)
    (exp,) = [e for e in c.search_experiments() if e.name == NAME]
    study = optuna.load_study(study_name=NAME, storage=f"sqlite:///{store / 'optuna.db'}")
    parent = study.user_attrs["mlflow_parent_run_id"]
    (race,) = c.search_runs([exp.experiment_id], "tags.`hpolab.role` = 'race'")
    assert race.data.tags["mlflow.parentRunId"] == parent and race.info.status == "FINISHED"
    best = study.best_trial
    assert race.data.tags["hpolab.race_winner"] == f"trial {best.number}"
    seed_runs = c.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{race.info.run_id}'")
    assert len(seed_runs) == 9  # 3 candidates x 3 seeds: nobody left to race a fourth seed
    assert {(r.data.tags["hpolab.race_candidate"], r.data.tags["hpolab.seed"]) for r in seed_runs} == \
        {(f"trial {n}", str(s)) for n in range(3) for s in (1, 2, 3)}
    assert all(r.info.run_name == f"race-{r.data.tags['hpolab.race_candidate'].replace(' ', '_')}-seed-{r.data.tags['hpolab.seed']}"
               for r in seed_runs)
    key = f"trial_{best.number}"
    m = race.data.metrics
    assert m[f"{key}.p_best"] == 1.0 and m[f"{key}.seeds"] == 3.0
    assert m[f"{key}.val_acc_ci95_low"] < m[f"{key}.val_acc_mean"] < m[f"{key}.val_acc_ci95_high"]
    summary = json.loads(Path(c.download_artifacts(race.info.run_id, "race.json", str(store))).read_text())
    winner = next(x for x in summary["candidates"] if x["label"] == f"trial {best.number}")
    assert winner["mean"] == pytest.approx(m[f"{key}.val_acc_mean"]) and len(winner["values"]) == 3

    (v,) = c.search_model_versions(f"name = '{NAME}'")
    assert v.tags["hpolab.race_run_id"] == race.info.run_id and v.tags["hpolab.race_winner"] == f"trial {best.number}"
    assert v.tags["hpolab.trial_number"] == str(best.number)
    model_run = next(r for r in seed_runs if r.info.run_id == v.tags["hpolab.trial_run_id"])  # the model: a race run
    seed = int(v.tags["hpolab.race_seed"])
    assert model_run.data.tags["hpolab.seed"] == str(seed) and v.tags["hpolab.seed"] == str(seed)
    values = [float(x) for x in winner["values"].values()]
    assert min(abs(x - np.mean(values)) for x in values) == pytest.approx(abs(winner["values"][str(seed)] - np.mean(values)))
    assert float(v.tags["hpolab.race_val_acc_mean"]) == pytest.approx(np.mean(values))
    # trained on the race's seed, on the study's split (data_seed 0), as its config says
    config = model_run.data.params
    assert config["seed"] == str(seed) and config["data_seed"] == "0" and float(config["trainer.lr"]) == pytest.approx(1e-2)
    assert study.user_attrs["hpolab.noise_floor"]["source"] == "race"
    _check_clean(store)
    _noise_floor_is_shown(store, study.user_attrs["hpolab.noise_floor"]["value"])

    again = run_cli("--store", str(store), "promote", NAME, "--race-seeds", "4").stdout  # read back, not trained again
    assert "seed runs to train" not in again and "is already version 1" in again
    assert f"trial {best.number} (champion v1)" in again  # the champion's configuration races as that candidate
    assert len(c.search_model_versions(f"name = '{NAME}'")) == 1
    assert len(c.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{race.info.run_id}'")) == 9


@pytest.mark.slow
def test_the_champions_configuration_winning_the_race_refuses(store):
    run_cli("--store", str(store), "promote", NAME, "--no-race")  # v1: the best trial's own run, no race
    out = run_cli("--store", str(store), "promote", NAME, "--race-seeds", "3", check=False)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "REFUSED: the champion's configuration" in out.stdout and "wins the race" in out.stdout
    assert len(_client(store).search_model_versions(f"name = '{NAME}'")) == 1


def _noise_floor_is_shown(store: Path, floor: float) -> None:
    """study status says the floor, compare marks the best (and who is tied with it), the report has the
    race's section with its plot and the floor's band on the optimisation history."""
    status = run_cli("--store", str(store), "study", "status", NAME).stdout
    assert f"noise floor: {floor:.4g} (sd of val_acc over training seeds" in status and "a promotion race: 9 runs of 3 configurations" in status
    rows = json.loads(run_cli("--store", str(store), "compare", NAME, "--format", "json").stdout)
    assert [r["tied"] for r in rows][0] == "best" and {r["tied"] for r in rows[1:]} <= {"", "yes"}
    assert "within it of the best, marked tied" in run_cli("--store", str(store), "compare", NAME).stdout
    out = store / "r.html"
    run_cli("--store", str(store), "report", NAME, "--out", str(out))
    html = out.read_text()
    assert 'data-plot="race"' in html and "mean ± CI" in html and "within the noise floor" in html


def _wait_for_a_finished_seed_run(store: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(t.state == TrialState.COMPLETE for t in _companion(store).get_trials()):
                return
        except (ValueError, KeyError, Exception):  # noqa: BLE001 -- not created yet
            pass
        time.sleep(0.5)
    raise AssertionError("no seed run of the race finished in time")


@pytest.mark.slow
def test_a_sigkilled_promote_resumes_its_race_and_registers_once(store):
    promote = start_cli("--store", str(store), "promote", NAME, "--race-seeds", "4",
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for_a_finished_seed_run(store)
    promote.send_signal(signal.SIGKILL)
    promote.communicate(timeout=60)
    done_before = sum(t.state == TrialState.COMPLETE for t in _companion(store).get_trials())
    assert 1 <= done_before < 9

    out = run_cli("--store", str(store), "promote", NAME, "--race-seeds", "4").stdout
    assert "registered race-digits version 1" in out
    trials = _companion(store).get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pairs = [(t.user_attrs["hpolab.race_candidate"], t.user_attrs["hpolab.seed"]) for t in complete]
    assert len(pairs) == len(set(pairs)) == 9  # every candidate and seed once, the finished ones not trained again
    c = _client(store)
    assert len(c.search_model_versions(f"name = '{NAME}'")) == 1
    (exp,) = [e for e in c.search_experiments() if e.name == NAME]
    assert len(c.search_runs([exp.experiment_id], "tags.`hpolab.role` = 'race'")) == 1
    _check_clean(store)


def test_several_objectives_race_the_pick_rule_on_the_means():
    from types import SimpleNamespace

    from hpolab.registry.race import Plan, RaceResult
    from hpolab.registry.race_front import front_winner

    # val_acc (maximize) against latency_ms (minimize), 3 seeds each: "b" is the most accurate on average,
    # "c" the fastest; "a" is dominated by "b" on the means
    per = {"a": {"val_acc": [0.90, 0.91, 0.92], "latency_ms": [2.0, 2.1, 2.0]},
           "b": {"val_acc": [0.95, 0.93, 0.96], "latency_ms": [1.9, 2.0, 1.9]},
           "c": {"val_acc": [0.85, 0.86, 0.84], "latency_ms": [1.0, 1.1, 1.0]}}
    objectives = {c: {m: dict(zip([1, 2, 3], v)) for m, v in ms.items()} for c, ms in per.items()}
    standings = {c: Standing(c, dict(objectives[c]["val_acc"])) for c in per}
    info = SimpleNamespace(objectives=["val_acc", "latency_ms"], metric="val_acc")

    def race():
        return RaceResult(Plan("s", "k", "s~race-k", [], [1, 2, 3], 3), "run", "val_acc", "maximize",
                          {c: Standing(c, dict(s.values)) for c, s in standings.items()},
                          directions=["maximize", "minimize"], objectives=objectives)

    r = race()
    winner, why = front_winner(r, info, "max val_acc")
    assert winner == "b" and why.startswith("--pick max val_acc over 3 seeds")
    assert r.standings["a"].p_best == 0.0 and sum(s.p_best for s in r.standings.values()) == pytest.approx(1.0)
    r = race()
    assert front_winner(r, info, "min latency_ms")[0] == "c"
    r = race()
    assert front_winner(r, info, None)[0] in ("b", "c")  # the knee of a two-point front of the means
