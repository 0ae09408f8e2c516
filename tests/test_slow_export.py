"""A trial whose model export is slow does not stall the driver (study/trials/uploads.py, tracker.py).

The trial process saves its model after its last epoch while the driver goes on (child_export.py);
waiting for that save must not hold the upload thread, which every other trial's checkpoint uploads
need, nor the driver's loop, which answers every other trial's epochs. The end-to-end test runs
three trials at parallel=2 with a checkpoint upload at every epoch; the first trial to save its model
sleeps 20 s in the save (tests/fault_project/experiments/slowexport.py). The logic tests drive the
Uploader directly.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, open_study, run_cli, trial_run

SLOW_S = 20.0
ARGS = ["experiment=slowexport", "n_trials=3", "parallel=2", "trainer.max_epochs=4", "model.sleep=0.01",
        "checkpoint_upload_every=0", "log_models=all"]


@pytest.mark.slow
def test_other_trials_finish_while_one_trial_s_model_export_is_slow(store, tmp_path):
    env = {**hpolab_env(), "HPOLAB_TEST_SLOW_EXPORT_DIR": str(tmp_path), "HPOLAB_TEST_SLOW_EXPORT_S": str(SLOW_S)}
    out = run_cli("--store", str(store), "study", "run", FAULT_SPEC, *ARGS, cwd=FAULT_PROJECT, env=env, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    slow_dir = Path((tmp_path / "slow").read_text())
    woke = dt.datetime.fromtimestamp(float((tmp_path / "slow.done").read_text()))
    client, study = open_study(store)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3, out.stdout
    (slow,) = [t for t in trials if slow_dir.name == f"trial-{t.number}"]
    others = [t for t in trials if t is not slow]
    # Both other trials ran their epochs (and uploads) to the end while the slow save still slept.
    for t in others:
        assert t.datetime_complete < woke, (t.number, t.datetime_complete, woke, out.stdout)
    for t in trials:  # nothing lost: every run closed with its model and its last checkpoint uploaded
        run = trial_run(t, client)
        assert run.info.status == "FINISHED", (t.number, run.data.tags)
        assert run.data.tags.get("hpolab.model_id"), (t.number, run.data.tags)
        assert run.data.tags.get("hpolab.checkpoint_epoch") == "4", (t.number, run.data.tags)


# ---------------------------------------------------------------- the Uploader on its own


def test_submit_returns_at_once_while_the_upload_thread_is_busy():
    from hpolab.study.trials.uploads import Uploader

    uploads, done, busy = Uploader(note=print), [], threading.Event()
    uploads.submit("a slow upload", busy.wait)
    submitting = threading.Thread(target=lambda: [uploads.submit(f"job {i}", done.append, i) for i in range(10)])
    submitting.start()
    submitting.join(timeout=2)  # the driver's loop, queueing ten epochs' uploads behind a slow one
    blocked = submitting.is_alive()
    busy.set()
    submitting.join()
    uploads.close()
    assert not blocked, "submit blocked the driver's loop while the upload thread was busy"
    assert done == list(range(10))  # all ran, in order


def test_a_model_being_saved_does_not_hold_the_upload_thread():
    import multiprocessing as mp

    from hpolab.study.trials.child_export import receive_model
    from hpolab.study.trials.uploads import Uploader

    driver_end, trial_end = mp.Pipe()
    life_read, life_write = mp.Pipe(duplex=False)
    uploads, order, problems = Uploader(note=print), [], []
    # Trial 0's process is saving its model: its run's close waits for the folder, off the upload thread.
    t0 = time.monotonic()
    uploads.after("trial 0: closing its run", lambda: receive_model(driver_end, life_write, problems.append),
                  lambda label, saved: order.append((label, saved)), "trial 0 closed")
    for epoch in range(1, 7):  # trial 1's checkpoint uploads, one per epoch, meanwhile
        uploads.submit(f"trial 1: epoch {epoch}", order.append, ("trial 1 uploaded", epoch))
    assert time.monotonic() - t0 < 1.0  # neither call waited
    deadline = time.monotonic() + 10
    while len(order) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert order == [("trial 1 uploaded", e) for e in range(1, 7)]  # done while trial 0 still saves
    trial_end.send(("model", "/trial-0/model"))  # the save ends: the close is queued with its folder
    uploads.close()
    assert order[-1] == ("trial 0 closed", "/trial-0/model") and not problems
    life_read.close()
