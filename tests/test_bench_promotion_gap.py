"""bench/promotion_gap.py: which promotions of a `study run`'s lines it measures (no training)."""

from __future__ import annotations

from conftest import bench_script


def test_promotions_in_process_and_pauses_resumed_at_once_are_told_apart_and_waits_left_out():
    lines = ["00:01 trial 0 paused at rung 0 (epoch 1) | running: none",
             "00:01 trial 1 started: lr=0.1",  # trial 0 waits: not measured
             "00:02 trial 1 promoted at rung 0 (epoch 1): goes on in its process",
             "00:02 trial 1 paused at rung 1 (epoch 3) | running: none",
             "00:02 trial 1 resumed after epoch 3 (promoted; from /s/trial-1/last.pt)",
             "00:03 trial 0 resumed after epoch 1 (promoted; from /s/trial-0/last.pt)"]
    assert bench_script("promotion_gap").promotions(lines) == {"in process": [(1, 1)], "paused, resumed at once": [(1, 3)]}
