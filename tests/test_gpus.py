"""A trial's GPU maps through the driver's own CUDA_VISIBLE_DEVICES (no GPU needed: count and mask faked)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from hpolab.study.trials.gpus import physical_devices, trial_indices
from hpolab.study.trials.runner import TrialRunner


def test_unset_mask_passes_indices_through():
    assert physical_devices(None, [0]) == "0"
    assert physical_devices(None, [1, 0]) == "1,0"
    assert physical_devices(None, []) is None


def test_slurm_style_mask_maps_to_physical_gpus():
    assert physical_devices("2,3", [0]) == "2"
    assert physical_devices("2,3", [1]) == "3"
    assert physical_devices("2, 3", [1, 0]) == "3,2"


def test_uuid_and_mig_masks_kept_as_strings():
    mask = "GPU-8f3c1b2a-0000-1111-2222-333344445555,GPU-aa00bb11-cccc-dddd-eeee-ffff00001111"
    assert physical_devices(mask, [1]) == "GPU-aa00bb11-cccc-dddd-eeee-ffff00001111"
    assert physical_devices("MIG-1234,MIG-5678", [0, 1]) == "MIG-1234,MIG-5678"


def test_index_outside_mask_is_an_error():
    with pytest.raises(ValueError, match="outside CUDA_VISIBLE_DEVICES"):
        physical_devices("2,3", [2])


def test_trial_indices_wrap_and_cap():
    assert trial_indices(None, 1, 2) == []
    assert trial_indices(0, 1, 0) == []
    assert trial_indices(1, 2, 2) == [1, 0]
    assert trial_indices(0, 4, 2) == [0, 1]  # capped at the GPUs there are


def _runner(n_gpus: int) -> TrialRunner:
    runner = TrialRunner("exp", "exp", parallel=2, project_dir=Path("."))
    runner._n_gpus = n_gpus  # fake the driver's device count (torch.cuda.device_count() honours the mask)
    return runner


def _running(gpu, devices=1):
    return SimpleNamespace(gpu=gpu, config={"trainer": {"devices": devices}})


def test_runner_gives_trials_physical_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    runner = _runner(2)
    first = runner.least_used_gpu([])
    assert first == 0
    assert runner.trial_gpus(_running(first)) == "2"  # not "0": physical GPU 0 is another job's
    second = runner.least_used_gpu([_running(first)])
    assert runner.trial_gpus(_running(second)) == "3"
    assert runner.trial_gpus(_running(1, devices=2)) == "3,2"  # trainer.devices: 2 takes two of them
    assert runner.devices_for(runner.least_used_gpu([])) == "2"  # the LR range test's child, too


def test_runner_without_mask_or_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _runner(4).trial_gpus(_running(3, devices=2)) == "3,0"
    assert _runner(0).trial_gpus(_running(None)) is None
