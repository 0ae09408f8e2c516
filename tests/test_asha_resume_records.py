"""A promoted trial records what the same configuration trained straight through records (the same
metric values at steps 1..N in one run), whether it paused at its rung and resumed in a new process
(forked and set up before its segment starts) or, promoted as it reached its rung, went on in its process."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from conftest import open_study, run_cli, trial_run

pytestmark = pytest.mark.slow

SPEC = "studies/bench_multifidelity.yaml"
COMMON = ["seed=3", "parallel=1", "trainer.max_epochs=4"]


def _records(store, name: str, t) -> dict:
    client, _ = open_study(store, name)
    run = trial_run(t, client)
    out = {key: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]
           for key in ("train_loss", "val_loss", "val_acc", "lr")}
    return {**out, "tags": run.data.tags}


def test_a_promoted_trial_records_what_an_uninterrupted_one_does_resumed_or_gone_on(store, tmp_path):
    # 4 configurations, rungs 1, 2, 4 at factor 2 (seed 3): trial 1 pauses at rung 0, resumes in a new
    # process once trial 0 is beaten there, and as it reaches rung 1 it is promoted and goes on in that process
    asha = "trial_scheduler={type: asha, min_epochs: 1, max_epochs: 4, reduction_factor: 2, brackets: 1}"
    out = run_cli("--store", str(store), "study", "run", SPEC, "name=paused", "n_trials=4", asha, *COMMON).stdout
    assert "trial 1 resumed after epoch 1" in out and "trial 1 promoted at rung 1 (epoch 2): goes on in its process" in out, out
    _, study = open_study(store, "paused")
    [top] = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert top.number == 1 and top.user_attrs["hpolab.rung"] == 2, top
    paused = _records(store, "paused", top)
    tags = paused.pop("tags")
    assert tags.get("hpolab.resumed_after_epoch") == "1" and tags.get("hpolab.promoted_from_rung") == "1", tags
    # The same configuration trained straight through, in a study of its own
    fixed = [f"{k}={v!r}" for k, v in top.params.items()]
    straight = tmp_path / "straight"
    run_cli("--store", str(straight), "study", "run", SPEC, "name=straight", "n_trials=1", "search_space={}", *fixed, *COMMON)
    _, study = open_study(straight, "straight")
    [one] = study.trials
    unpaused = _records(straight, "straight", one)
    unpaused.pop("tags")
    assert [s for s, _ in paused["val_loss"]] == [1, 2, 3, 4]
    assert paused == unpaused
