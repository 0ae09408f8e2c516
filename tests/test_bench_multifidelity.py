"""bench/multifidelity.py: its pure parts on fabricated metric histories (no training), the arms' specs
through the real spec loader, and one slow smoke run of the script through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import bench_script

ROOT = Path(__file__).resolve().parents[1]
mf = bench_script("multifidelity")


def test_epochs_are_counted_once_in_the_order_received_and_the_target_is_the_first_good_enough():
    # Trial 0 trains 3 epochs; trial 1 pauses after epoch 1 and resumes for epochs 2-3 later; trial 2 is a
    # retried copy that re-reports trial 2's epoch 1 (same step, later): counted once, at its first report.
    histories = {
        0: [(10.0, 1, 0.50), (11.0, 2, 0.70), (12.0, 3, 0.80)],
        1: [(10.5, 1, 0.60), (20.0, 2, 0.90), (21.0, 3, 0.95)],
        2: [(13.0, 1, 0.40), (14.0, 1, 0.40), (15.0, 2, 0.93)],
    }
    events = mf.epochs_of(histories)
    assert [(e[1], e[2]) for e in events] == [(0, 1), (1, 1), (0, 2), (0, 3), (2, 1), (2, 2), (1, 2), (1, 3)]
    got = mf.summarise(events, target=0.92)
    assert got == {"best": 0.95, "epochs": 8, "epochs_to_target": 6}  # trial 2's epoch 2 (0.93) is the 6th epoch
    assert mf.summarise(events, target=0.99)["epochs_to_target"] is None
    assert mf.summarise(events, target=None)["epochs_to_target"] is None
    assert mf.best_so_far(events) == [0.5, 0.6, 0.7, 0.8, 0.8, 0.93, 0.93, 0.95]
    assert mf.best_so_far([[0, 1, 0.5], [1, 1, 0.7], [0, 2, 0.6]]) == [0.5, 0.7, 0.7]  # as saved in the JSON


def test_a_metric_to_minimise_counts_down():
    events = mf.epochs_of({0: [(1.0, 1, 3.0), (2.0, 2, 1.5)], 1: [(1.5, 1, 2.0)]})
    assert mf.summarise(events, target=1.8, maximize=False) == {"best": 1.5, "epochs": 3, "epochs_to_target": 3}
    assert mf.best_so_far(events, maximize=False) == [3.0, 2.0, 1.5]


def test_mean_and_sd_skip_arms_that_never_reached_the_target():
    assert mf.mean_sd([None, None]) == (None, None, 0)
    assert mf.mean_sd([4.0]) == (4.0, 0.0, 1)
    mean, sd, n = mf.mean_sd([2.0, None, 4.0])
    assert (mean, n) == (3.0, 2) and sd == pytest.approx(1.41421, rel=1e-4)


def test_the_table_names_a_missing_arm_and_each_arms_share_of_random_epochs():
    rows = [{"arm": "random", "seed": 0, "best": 0.97, "epochs": 324, "epochs_to_target": 200, "wall_s": 30.0},
            {"arm": "asha", "seed": 0, "best": 0.968, "epochs": 110, "epochs_to_target": 81, "wall_s": 40.0},
            {"arm": "pbt", "seed": 0, "refused": "hpolab: trial_scheduler.type: pbt is not available yet"}]
    text = mf.table(rows, ["random", "asha", "pbt"], random_epochs=324)
    assert "| asha | 1 | 96.80 ± 0.00 | 110 ± 0 | 81 ± 0 (1/1 reached) | 0.25 | 40 ± 0 |" in text
    assert "| pbt | 0 | missing: hpolab: trial_scheduler.type: pbt is not available yet |" in text


def test_a_study_s_wall_time_splits_into_start_trials_and_end_and_gives_asha_s_least_ratio():
    # The command started at t=100 and took 15 s; its first run was created at 105.5; epochs arrived until 114.
    events = mf.epochs_of({0: [(106.0, 1, 0.5), (114.0, 2, 0.9)], 1: [(108.0, 1, 0.7)]})
    ph = mf.phases(100.0, 15.0, 105.5, events)
    assert ph == {"start": 5.5, "trials": 8.5, "end": 1.0}
    assert sum(ph.values()) == pytest.approx(15.0)
    assert mf.phases(100.0, 15.0, None, []) is None  # a study with no run: nothing to split
    # Random: 324 epochs in an 8.5 s trials phase. ASHA's 162 epochs at that cost, with random's start and
    # end: (5.5 + 1.0 + 4.25) / 15 = 0.717x, whatever ASHA's own wall was.
    random = {"wall_s": 15.0, "epochs": 324, "phases": ph}
    assert mf.free_segments_ratio(random, {"wall_s": 19.0, "epochs": 162}) == pytest.approx(10.75 / 15)
    assert mf.free_segments_ratio({**random, "phases": None}, {"wall_s": 19.0, "epochs": 162}) is None
    rows = [{"arm": "random", "seed": 0, "wall_s": 15.0, "cpu_s": 8.0, "epochs": 324, "phases": ph},
            {"arm": "asha", "seed": 0, "wall_s": 19.0, "cpu_s": 12.0, "epochs": 162,
             "phases": {"start": 5.6, "trials": 12.0, "end": 1.4}}]
    text = mf.wall_ratios(rows, [None])
    assert "asha / random wall: 1.27x (seed 0 1.27x)" in text
    assert "start | trials | end, mean s: random 5.5 | 8.5 | 1.0; asha 5.6 | 12.0 | 1.4" in text
    assert "its segments nothing more: 0.72x (seed 0 0.72x)" in text


@pytest.mark.parametrize("arm", ["random", "hyperband"])
def test_the_arms_specs_load(arm):
    # The overrides each arm passes on the command line are a valid spec (the arms that need a trial
    # scheduler are checked by the smoke run, where the CLI may still refuse them).
    sys.path.insert(0, str(ROOT / "platform"))
    from hpolab.config.spec import load_spec

    spec = load_spec(ROOT / mf.SPEC, ["seed=1", *mf.arm_overrides(arm, 4)])
    assert spec.name == mf.STUDY and spec.trainer.max_epochs == mf.MAX_EPOCHS
    assert spec.n_trials == (4 if arm == "random" else 12)


@pytest.mark.slow
def test_the_script_runs_two_arms_through_the_cli(tmp_path):
    out = tmp_path / "mf.json"
    proc = subprocess.run([sys.executable, "bench/multifidelity.py", "--seeds", "0", "--trials", "2", "--arms", "random",
                           "hyperband", "--json", str(out), "--plot", str(tmp_path / "mf.png")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["arm"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["random"]["epochs"] == 2 * mf.MAX_EPOCHS and rows["random"]["states"] == {"COMPLETE": 2}
    assert rows["hyperband"]["epochs_to_target"] is None or rows["hyperband"]["epochs_to_target"] <= rows["hyperband"]["epochs"]
    assert (tmp_path / "mf.png").stat().st_size > 1000
    assert "| random | 1 |" in proc.stdout


def test_the_lr_decay_summary_compares_constant_step_down_fixed_population_and_pbt_per_seed():
    # val_loss (minimised): the schedules arm's grid (trial: lr, scheduler), the fixed population, PBT's members.
    def arm(name, trial_best, params, schedules=None):
        return {"arm": name, "seed": 0, "trial_best": trial_best, "params": params, "lr_schedules": schedules or {}}

    rows = [arm("schedules", [[0, 1.20, 18], [1, 1.05, 16], [2, 1.10, 9], [3, 1.30, 18]],
                {0: {"trainer.lr": 0.1, "trainer.scheduler": "none"}, 1: {"trainer.lr": 0.3, "trainer.scheduler": "step"},
                 2: {"trainer.lr": 0.3, "trainer.scheduler": "none"}, 3: {"trainer.lr": 0.1, "trainer.scheduler": "step"}}),
            arm("random", [[0, 1.15, 17], [1, 1.40, 18]], {0: {"trainer.lr": 0.2}, 1: {"trainer.lr": 0.02}}),
            arm("pbt", [[0, 1.12, 12], [1, 1.02, 18]], {0: {"trainer.lr": 0.2}, 1: {"trainer.lr": 0.02}},
                {"1": [[1, 0.02], [4, 0.2], [13, 0.05]]})]  # as read back from the JSON: string keys, lists
    got = mf.lr_decay_summary(rows)
    assert got == [{"seed": 0, "constant": [1.10, 0.3], "step_down": [1.05, 0.3], "fixed": [1.15, 0.2],
                    "pbt": [1.02, 1, 18], "pbt_schedule": [[1, 0.02], [4, 0.2], [13, 0.05]]}]
    text = mf.lr_decay_table(got)
    assert "| 0 | 1.1000 (lr 0.3) | 1.0500 (lr 0.3) | 1.1500 (lr 0.2) | 1.0200 (epoch 18) | -0.1300 | 0.02 → 0.2 @4 → 0.05 @13 |" in text


def test_the_lr_decay_arms_specs_load():
    sys.path.insert(0, str(ROOT / "platform"))
    from hpolab.config.spec import load_spec

    task = mf.TASKS["lr-decay"]
    grid = load_spec(ROOT / task["spec"], ["seed=1", *mf.arm_overrides("schedules", 12, task["epochs"])])
    assert grid.n_trials == 2 * len(mf.SCHEDULE_LRS) and grid.sampler.type == "grid"
    fixed = load_spec(ROOT / task["spec"], ["seed=1", *mf.arm_overrides("random", 12, task["epochs"])])
    assert fixed.name == task["study"] and fixed.trainer.max_epochs == task["epochs"] and fixed.trainer.momentum == 0.0


def test_the_lr_decay_task_redraws_only_training_labels():
    sys.path.insert(0, str(ROOT / "platform"))
    from hpolab.config.experiment import load_experiment

    exp = load_experiment("digits_noisy_mlp", ROOT)
    data = {"val_fraction": 0.4, "test_fraction": 0.1}
    clean, noisy = exp.load_data({**data, "label_noise": 0.0}, data_seed=3), exp.load_data({**data, "label_noise": 0.6}, data_seed=3)
    for part in ("val", "test"):  # the same images and true labels
        assert all((a == b).all() for a, b in zip(getattr(clean, part).tensors, getattr(noisy, part).tensors))
    changed = (clean.train.tensors[1] != noisy.train.tensors[1]).float().mean().item()
    assert 0.45 < changed < 0.63  # 60% redrawn, a tenth of those to their own class again
    with pytest.raises(ValueError, match="label_noise"):
        exp.load_data({**data, "label_noise": 1.0}, data_seed=3)


@pytest.mark.slow
def test_the_lr_decay_comparison_runs_through_the_cli(tmp_path):
    out = tmp_path / "lr.json"
    proc = subprocess.run([sys.executable, "bench/multifidelity.py", "--pbt-task", "lr-decay", "--seeds", "0", "--trials", "4",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    saved = json.loads(out.read_text())
    rows = {r["arm"]: r for r in saved["rows"]}
    assert rows["schedules"]["states"] == {"COMPLETE": 8} and rows["pbt"]["states"] == {"COMPLETE": 4}
    assert rows["pbt"]["exploited"] >= 1 and saved["summary"][0]["pbt_schedule"]
    assert "| 0 | " in proc.stdout and "step-down" in proc.stdout
