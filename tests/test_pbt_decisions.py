"""PBT's exploit/explore decisions on fabricated trials (no training): boundaries, when a boundary is
decided, bottom quantile copies the top one's checkpoint of the same boundary, explore rules, the
schedule and parents recorded, the same answer again, direction, population cap."""

from __future__ import annotations

import random

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

from hpolab.config.spec import StudySpec
from hpolab.config.trial_scheduler import Choices, Factor, Range
from hpolab.study.driver.pauses import epochs_in_flight
from hpolab.study.objectives.pbt import EXPLOITED_TAG, PARENTS_ATTR, PARENTS_TAG, SCHEDULE_ATTR, Pbt, members_of, schedule_of
from hpolab.study.objectives.pbt_explore import explore, perturb
from hpolab.study.objectives.trial_scheduler import CHANGES_ATTR
from hpolab.stores.trial_states import PAUSED as PAUSED_ATTR
from hpolab.stores.paths import Stores
from hpolab.train.checkpoint import CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint

LR = FloatDistribution(1e-4, 1e-1, log=True)


def spec(direction="maximize", population=4, quantile=0.25, mutations=None, resample=0.0, max_epochs=6) -> StudySpec:
    return StudySpec.model_validate({
        "name": "pbt-fab", "experiment": "digits_cnn", "metric": "val_acc", "direction": direction, "seed": 7,
        "trial_scheduler": {"type": "pbt", "population": population, "interval_epochs": 2, "quantile": quantile,
                            "mutations": mutations or {"trainer.lr": {"factor": [0.8, 1.25]}}, "resample_probability": resample},
        "search_space": {"trainer.lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}},
        "trainer": {"max_epochs": max_epochs},
    })


def member(number: int, curve: dict[int, float], *, paused_epoch: int | None = None, lr=0.01, state=TrialState.RUNNING,
           user_attrs=None, failed_trial: int | None = None) -> optuna.trial.FrozenTrial:
    system = {PAUSED_ATTR: {"rung": 0, "epoch": paused_epoch}} if paused_epoch else {}
    if failed_trial is not None:  # a retry copy (study/state/retry.py writes both)
        system.update({"failed_trial": failed_trial, "retry_history": [failed_trial]})
    t = optuna.trial.create_trial(state=state, value=max(curve.values()) if state == TrialState.COMPLETE else None, params={"trainer.lr": lr}, distributions={"trainer.lr": LR},
                                  intermediate_values=curve if state != TrialState.WAITING else None,
                                  system_attrs=system, user_attrs=user_attrs or {})
    t.number, t._trial_id = number, 100 + number
    return t


def scheduler(tmp_path, **kw) -> Pbt:
    stores = Stores(root=tmp_path, optuna_url="sqlite://", tracking_uri="sqlite://", artifact_location=None)
    return Pbt(spec(**kw), stores)


def with_last_pt(pbt: Pbt, trials, content="ckpt") -> None:
    """Each member's last.pt as the training routine writes it: its weights (here a marker) and its own
    record (history, best value and epoch, early stopping); best.pt a file of its own."""
    for t in trials:
        d = pbt.trial_dir(t.number)
        d.mkdir(parents=True, exist_ok=True)
        save_checkpoint({"format_version": CHECKPOINT_FORMAT, "history": [{"epoch": 1, "member": t.number}],
                         "best_value": float(t.number), "best_epoch": 1,
                         "state": {"model": f"{content}{t.number}", "early_stopping": {"member": t.number}}}, d / "last.pt")
        (d / "best.pt").write_bytes(b"best" + str(t.number).encode())


def weights(path) -> str:
    return load_checkpoint(path, map_location="cpu")["state"]["model"]


def test_pauses_at_each_interval_boundary_below_max_epochs(tmp_path):
    pbt = scheduler(tmp_path)
    t = member(0, {})
    assert [pbt.pause_epoch(t, start) for start in (1, 2, 3, 4, 5, 6)] == [2, 2, 4, 4, None, None]


def test_a_segment_training_counts_its_epochs_in_flight_up_to_its_boundary_or_the_end(tmp_path):
    # budget.epochs counts what the segments training now will still train (pauses.epochs_in_flight):
    # a member's last interval trains to max_epochs, not 0 epochs (parallel slots overshot by a segment).
    pbt = scheduler(tmp_path)  # boundaries 2, 4; max_epochs 6
    assert epochs_in_flight(pbt, [member(0, {1: 0.1})]) == 1  # to its boundary at 2
    assert epochs_in_flight(pbt, [member(1, {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4})]) == 2  # its last interval: to 6
    assert epochs_in_flight(pbt, [member(2, {4: 0.4}, paused_epoch=4)]) == 0  # paused: no process
    assert [pbt.rung_index(member(0, {}), e) for e in (1, 2, 3, 4, 6)] == [None, 0, None, 1, None]  # boundary index
    assert pbt.top_epochs() == 6


def test_a_boundary_waits_for_the_whole_population_then_the_worst_copies_the_best(tmp_path):
    pbt = scheduler(tmp_path)
    trials = [member(i, {1: v - 0.1, 2: v}, paused_epoch=2, lr=lr) for i, (v, lr) in enumerate([(0.5, 0.01), (0.9, 0.02), (0.7, 0.03)])]
    with_last_pt(pbt, trials)
    assert pbt.may_start_new(trials) and pbt.next_resume(trials) is None  # three of four members exist
    trials.append(member(3, {1: 0.2}))  # the fourth is still training toward epoch 2
    assert not pbt.may_start_new(trials) and pbt.next_resume(trials) is None
    trials[3] = member(3, {1: 0.2, 2: 0.3}, paused_epoch=2, lr=0.04)
    with_last_pt(pbt, trials[3:])
    first = pbt.next_resume(trials)
    assert first.number == 0 and first.config_changes == {} and first.params == {"pbt.trainer.lr": 0.01}
    assert first.checkpoint == pbt.trial_dir(0) / "last.pt" and first.tags == {}
    # every member's checkpoint of epoch 2 is kept before any of them resumes past it
    assert all(weights(pbt.trial_dir(i) / "pbt_epoch_2.pt") == f"ckpt{i}" for i in range(4))
    # member 3 (0.3) is the bottom quarter: it copies member 1 (0.9, the top quarter) at epoch 2
    worst = pbt.next_resume([t for t in trials if t.number in (1, 2, 3)] + [member(0, {1: 0.4, 2: 0.5, 3: 0.6})])
    assert worst.number == 1  # paused longest: the lowest number first
    decision = pbt.decide(members_of(trials), 3, 2)
    assert decision.donor == 1 and decision.values["trainer.lr"] in (pytest.approx(0.016), pytest.approx(0.025))
    resume = pbt.resume_for(members_of(trials)[3], trials[3], decision)
    # it resumes from its own last.pt, which took the donor's weights and training state at epoch 2 (a
    # retry of its next segment resumes the exploit) and kept its own record: a member is one run
    assert resume.checkpoint == pbt.trial_dir(3) / "last.pt" and resume.source == pbt.trial_dir(1) / "pbt_epoch_2.pt"
    own = load_checkpoint(pbt.trial_dir(3) / "last.pt", map_location="cpu")
    assert own["state"]["model"] == "ckpt1" and own["history"] == [{"epoch": 1, "member": 3}] and own["best_value"] == 3.0
    assert own["state"]["early_stopping"] == {"member": 3}
    assert (pbt.trial_dir(3) / "best.pt").read_bytes() == b"best3"  # its own best model: what its run logged
    assert resume.config_changes == {"trainer.lr": decision.values["trainer.lr"]}
    assert resume.tags == {PARENTS_TAG: "1@2", EXPLOITED_TAG: "1@2"}
    assert resume.params == {"pbt.trainer.lr": decision.values["trainer.lr"]}
    assert resume.attrs == {SCHEDULE_ATTR: {"1": {"trainer.lr": 0.04}, "3": {"trainer.lr": decision.values["trainer.lr"]}},
                            PARENTS_ATTR: ["1@2"]}  # written on trial 3 by the driver (pauses.start)


def test_the_decision_is_the_same_when_asked_again_and_only_the_bottom_exploits(tmp_path):
    pbt = scheduler(tmp_path, population=8, quantile=0.25, mutations={"trainer.lr": {"factor": [0.5, 2.0]}})
    trials = [member(i, {2: i / 10}, paused_epoch=2, lr=0.001 * (i + 1)) for i in range(8)]
    with_last_pt(pbt, trials)
    pbt.snapshot(members_of(trials), 2)
    members = members_of(trials)
    first = [(pbt.decide(members, r, 2).donor, pbt.decide(members, r, 2).values) for r in (0, 1)]
    again = [(pbt.decide(members, r, 2).donor, pbt.decide(members, r, 2).values) for r in (0, 1)]
    assert first == again
    assert {d for d, _ in first} <= {6, 7}  # the top quarter of eight: members 7 and 6
    assert all(pbt.decide(members, r, 2).donor is None for r in range(2, 8))  # not the bottom quarter: their own


def test_minimize_exploits_from_the_smallest_and_nan_is_worst(tmp_path):
    pbt = scheduler(tmp_path, direction="minimize")
    trials = [member(i, {2: v}, paused_epoch=2) for i, v in enumerate([0.1, float("nan"), 0.5, 0.3])]
    with_last_pt(pbt, trials)
    pbt.snapshot(members_of(trials), 2)
    members = members_of(trials)
    assert pbt.decide(members, 1, 2).donor == 0  # NaN is the bottom; 0.1 the top
    assert pbt.decide(members, 2, 2).donor is None


def test_a_dead_member_is_not_waited_for_and_a_retry_copy_is_the_same_member(tmp_path):
    pbt = scheduler(tmp_path)
    trials = [member(i, {2: 0.1 * i}, paused_epoch=2) for i in range(3)] + [member(3, {1: 0.5}, state=TrialState.FAIL)]
    with_last_pt(pbt, trials)
    copy = member(4, {1: 0.5}, state=TrialState.WAITING, failed_trial=3)
    assert len(members_of(trials + [copy])) == 4  # the copy continues member 3: four members still
    assert pbt.may_start_new(trials + [copy])  # ask() takes the WAITING copy first: it must be asked
    assert pbt.next_resume(trials + [copy]) is None  # member 3's copy will reach epoch 2: wait for it
    assert pbt.next_resume(trials).number == 0  # member 3 is dead without a copy: not waited for


def test_a_member_already_exploited_keeps_its_parents_once_per_boundary(tmp_path):
    pbt = scheduler(tmp_path)
    earlier = {SCHEDULE_ATTR: {"1": {"trainer.lr": 0.01}, "3": {"trainer.lr": 0.03}}, PARENTS_ATTR: ["2@2"], CHANGES_ATTR: {"trainer.lr": 0.03}}
    trials = [member(0, {4: 0.1}, paused_epoch=4, user_attrs=earlier)] + [member(i, {4: 0.5 + i / 10}, paused_epoch=4) for i in (1, 2, 3)]
    with_last_pt(pbt, trials)
    resume = pbt.next_resume(trials)
    assert resume.number == 0 and resume.tags[PARENTS_TAG].startswith("2@2,") and resume.tags[EXPLOITED_TAG].endswith("@4")
    assert resume.attrs[SCHEDULE_ATTR]["1"] == {"trainer.lr": 0.01} and set(resume.attrs[SCHEDULE_ATTR]) == {"1", "3", "5"}
    assert schedule_of(members_of([member(0, {}, user_attrs=resume.attrs)])[0])[0] == (1, {"trainer.lr": 0.01})
    trials[0] = member(0, {4: 0.1}, paused_epoch=4, user_attrs={**earlier, **resume.attrs})  # its records written (pauses.start)
    again = pbt.next_resume(trials)  # asked again before the resume took effect (a re-run): the same, no second parent
    assert again.tags == resume.tags and again.attrs == resume.attrs and len(again.attrs[PARENTS_ATTR]) == 2


def test_the_current_value_of_an_unsearched_key_comes_from_the_spec(tmp_path):
    pbt = scheduler(tmp_path, mutations={"trainer.weight_decay": {"range": [0.0, 0.02]}})
    assert pbt.value_of({"trainer.lr": 0.1}, "trainer.weight_decay") == 0.01


def test_explore_rules():
    rng = random.Random(0)
    for _ in range(50):
        assert perturb(0.1, Factor(factor=(0.8, 1.25)), rng) in (pytest.approx(0.08), pytest.approx(0.125))
        assert perturb("b", Choices(choices=["a", "b", "c"]), rng) in ("a", "c")
        assert perturb("a", Choices(choices=["a", "b", "c"]), rng) in ("a", "b")  # clamped at the ends
        assert 0.0 <= perturb(0.019, Range(range=(0.0, 0.02)), rng) <= 0.02
        assert perturb(64, Factor(factor=(0.8, 1.25)), rng) in (51, 80)  # an int stays an int
        assert 1e-4 <= explore(0.5, Factor(factor=(0.8, 1.25)), LR, 1.0, rng) <= 1e-1  # resampled from the search space
        assert explore(0.5, Choices(choices=[1, 2]), None, 1.0, rng) in (1, 2)
        assert explore("x", Choices(choices=["x", "y"]), CategoricalDistribution(["p", "q"]), 1.0, rng) in ("p", "q")
        assert explore(0.5, Factor(factor=(0.8, 1.25)), None, 1.0, rng) in (pytest.approx(0.4), pytest.approx(0.625))


def test_boundary_copies_are_deleted_once_every_member_is_past_them(tmp_path):
    pbt = scheduler(tmp_path)
    trials = [member(i, {2: 0.1 * i, 3: 0.2, 4: 0.3}, paused_epoch=4) for i in range(3)] + [member(3, {2: 0.5, 3: 0.6})]
    for t in trials:
        for name in ("pbt_epoch_2.pt", "pbt_epoch_2_best.pt", "pbt_epoch_4.pt"):
            (pbt.trial_dir(t.number)).mkdir(parents=True, exist_ok=True)
            (pbt.trial_dir(t.number) / name).write_bytes(b"x")
    pbt.tidy(members_of(trials))  # member 3 trains toward epoch 4: the copies of epoch 2 are no use any more
    assert sorted(p.name for p in pbt.trial_dir(3).iterdir()) == ["pbt_epoch_4.pt"]
    trials[3] = member(3, {2: 0.5, 3: 0.6}, state=TrialState.FAIL)
    trials[0] = member(0, {2: 0.0, 3: 0.2, 4: 0.3, 5: 0.1, 6: 0.2}, state=TrialState.COMPLETE)
    pbt.tidy(members_of(trials))  # members 1 and 2 are paused at 4: its copies stay
    assert (pbt.trial_dir(0) / "pbt_epoch_4.pt").exists()
    pbt.tidy(members_of([member(i, {6: 0.1}, state=TrialState.COMPLETE) for i in range(4)]))  # the end: none left
    assert not list(tmp_path.rglob("pbt_epoch_*"))
