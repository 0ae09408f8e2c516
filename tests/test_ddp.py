"""Multi-device trials (trainer.devices > 1): DDP on the CPU with gloo and 2 processes.

fit() level: 2 ranks train on the same effective batch as one process and reach the same
validation metrics; through the real CLI: a pruned DDP trial is PRUNED with the right epochs and
leaves no process behind, and a COMPLETE one logs its model like a single-device trial.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train import DataSplits, TrainConfig, fit, seed_everything
from hpolab.train.distributed import close_ranks, init_ranks

EPOCHS = 4


def _data(n_train: int = 256, n_val: int = 128) -> DataSplits:
    g = torch.Generator().manual_seed(123)
    w = torch.randn(10, 3, generator=g)

    def split(n):
        x = torch.randn(n, 10, generator=g)
        return TensorDataset(x, (x @ w).argmax(1))

    return DataSplits(train=split(n_train), val=split(n_val), test=split(64), num_classes=3, input_shape=(10,))


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))


def _cfg(devices: int, **kw) -> TrainConfig:
    base = dict(max_epochs=EPOCHS, batch_size=32, lr=3e-2, device="cpu", amp="off", devices=devices, scheduler="cosine")
    return TrainConfig(**{**base, **kw})


def _fit(cfg: TrainConfig, ranks=None, on_epoch=None, checkpoint_dir=None):
    seed_everything(0)
    model = _model()
    return fit(cfg, model, _data(), metric="val_acc", direction="maximize", seed=0, ranks=ranks,
               on_epoch=on_epoch, checkpoint_dir=checkpoint_dir)


def _rank(rank: int, world: int, port: int, kw: dict, out, stop_after: int | None, ckpt: str | None) -> None:
    try:
        _rank_body(rank, world, port, kw, out, stop_after, ckpt)
    except BaseException:  # the parent's assertion says why this rank died, instead of waiting on its pipe
        import traceback

        out.send(("error", rank, traceback.format_exc()))
        raise
    finally:
        out.close()


def _rank_body(rank: int, world: int, port: int, kw: dict, out, stop_after: int | None, ckpt: str | None) -> None:
    torch.set_num_threads(1)
    ranks = init_ranks(rank, world, host="127.0.0.1", port=port, device=torch.device("cpu"), timeout_s=120)
    seen = []

    def on_epoch(epoch, metrics):
        seen.append(epoch)
        return stop_after is not None and epoch >= stop_after

    result = _fit(_cfg(world, **kw), ranks, on_epoch=on_epoch, checkpoint_dir=ckpt if rank == 0 else None)
    close_ranks()
    out.send((rank, result.history, result.stop_reason, seen))


def _fit_ranks(world: int, stop_after: int | None = None, ckpt: str | None = None, **kw):
    """fit() on `world` forked CPU ranks (gloo); [(rank, history, stop_reason, epochs on_epoch saw)] by rank."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=timedelta(seconds=120), wait_for_workers=False)
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in range(world)]
    procs = [ctx.Process(target=_rank, args=(r, world, store.port, kw, pipes[r][1], stop_after, ckpt)) for r in range(world)]
    for p in procs:
        p.start()
    for _, child_end in pipes:
        child_end.close()  # only the rank holds its write end: a rank that dies is an EOF here, not a hang
    results = []
    for r in range(world):
        ready = pipes[r][0].poll(600)  # a ceiling, not a threshold: a rank takes seconds
        try:
            message = pipes[r][0].recv() if ready else None
        except EOFError:
            message = None
        assert message is not None and message[0] != "error", (
            f"rank {r} sent no result (exit codes {[p.exitcode for p in procs]}): {message}")
        results.append(message)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return sorted(results, key=lambda r: r[0])


@pytest.mark.parametrize("accum", [1, 2])
def test_two_ranks_match_one_process(accum):
    single = _fit(_cfg(1, grad_accum_steps=accum))
    results = _fit_ranks(2, grad_accum_steps=accum)
    (_, h0, reason0, seen0), (_, h1, reason1, seen1) = results
    assert reason0 == reason1 == "max_epochs"
    assert seen0 == list(range(1, EPOCHS + 1)) and seen1 == []  # only rank 0 calls on_epoch
    # Every rank holds the same metrics (rank 0 evaluated and broadcast them).
    timing = ("epoch_seconds", "samples_per_second", "data_wait_fraction")  # each rank's own clock
    for a, b in zip(h0, h1):
        assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
    # Same effective batch, same samples per step: the same run as one process up to float summation order.
    for one, two in zip(single.history, h0):
        for key in ("train_loss", "val_loss", "val_acc", "lr", "grad_norm"):
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-5), (one["epoch"], key, one[key], two[key])
    print("devices=1 vs 2 after", EPOCHS, "epochs:", single.history[-1]["val_acc"], h0[-1]["val_acc"],
          "val_loss diff", abs(single.history[-1]["val_loss"] - h0[-1]["val_loss"]))


def test_rank0_stop_stops_every_rank_and_only_rank0_writes(tmp_path):
    results = _fit_ranks(2, stop_after=2, ckpt=str(tmp_path))
    for rank, history, reason, _ in results:
        assert reason == "stopped_by_caller" and [h["epoch"] for h in history] == [1, 2], rank
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]


def test_batch_size_must_divide_by_devices():
    with pytest.raises(ValueError, match="divisible by devices"):
        TrainConfig(batch_size=33, devices=2)


# ---- through the real CLI: a study whose trials each run on 2 CPU processes (gloo)

from conftest import hpolab_env, run_cli  # noqa: E402

DDP = ["studies/digits_cnn.yaml", "trainer.devices=2", "parallel=1", "trainer.max_epochs=2", "sampler={type: random}"]


def _tagged_processes(tag: str) -> list[int]:
    """Live processes (not zombies) whose environment carries `tag`: everything the CLI run started."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag.encode() in environ and state != "Z":
            found.append(int(pid))
    return found


@pytest.mark.slow
def test_ddp_trials_complete_and_prune_through_the_cli(store):
    import optuna
    from mlflow import MlflowClient

    env = hpolab_env()
    tag = f"HPOLAB_DDP_TEST={os.getpid()}-{id(store)}"
    env["HPOLAB_DDP_TEST"] = tag.split("=", 1)[1]
    # trial 0: no pruner -> COMPLETE with its model logged; trial 1: val_acc < 0.99 after epoch 1 -> PRUNED
    run_cli("--store", str(store), "study", "run", *DDP, "n_trials=1", "pruner={type: none}", env=env)
    out = run_cli("--store", str(store), "study", "run", *DDP, "n_trials=2", "pruner={type: threshold, kwargs: {lower: 0.99}}", "log_models=none",
                  "--allow-spec-change", env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert _tagged_processes(tag) == []  # no rank, trial process or forkserver outlived the driver

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    study = optuna.load_study(study_name="digits-cnn", storage=f"sqlite:///{store / 'optuna.db'}")
    done, pruned = study.get_trials()
    assert done.state == optuna.trial.TrialState.COMPLETE and pruned.state == optuna.trial.TrialState.PRUNED
    assert sorted(done.intermediate_values) == [1, 2] and sorted(pruned.intermediate_values) == [1]

    run = client.get_run(done.user_attrs["mlflow_run_id"])
    assert run.data.tags["hpolab.state"] == "COMPLETE" and run.data.params["trainer.devices"] == "2"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")] == [1, 2]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == [1, 2]
    assert "checkpoints/best.pt" in [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")]
    assert run.data.tags["hpolab.model_uri"].startswith("models:/")
    assert done.value == pytest.approx(max(m.value for m in client.get_metric_history(run.info.run_id, "val_acc")))

    prun = client.get_run(pruned.user_attrs["mlflow_run_id"])
    assert prun.data.tags["hpolab.state"] == "PRUNED" and prun.data.tags["hpolab.pruned_at_epoch"] == "1"
    assert [m.step for m in client.get_metric_history(prun.info.run_id, "val_acc")] == [1]

    import mlflow.pytorch

    mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
    try:
        model = mlflow.pytorch.load_model(run.data.tags["hpolab.model_uri"])
    finally:
        mlflow.set_tracking_uri(None)
    out = model(torch.zeros(2, 1, 8, 8))
    assert tuple(out.shape) == (2, 10) and bool(torch.isfinite(out).all())
    assert not any(math.isnan(v) for v in done.intermediate_values.values())


# ---- the trial process of a DDP trial, driven by hand: a dead rank or a dead driver ends every rank

import signal  # noqa: E402
import time  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _children(pid: int) -> list[int]:
    kids = []
    for p in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            stat = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == pid and stat[0] != "Z":
            kids.append(int(p))
    return kids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _trial_entry(child_conn, life_read, job, driver_ends) -> None:
    from hpolab.study.trials import trial_process

    for end in driver_ends:
        end.close()
    trial_process.run(child_conn, life_read, job)


def _start_ddp_trial(tmp_path):
    trainer = {"max_epochs": 200, "batch_size": 64, "lr": 3e-3, "device": "cpu", "amp": "off", "devices": 2}
    config = {"seed": 0, "metric": "val_acc", "direction": "maximize", "trainer": trainer,
              "data": {"val_fraction": 0.2, "test_fraction": 0.2, "augment": False},
              "model": {"channels": 8, "depth": 1, "dropout": 0.0}}
    job = {"experiment": "digits_cnn", "config": config, "checkpoint_dir": str(tmp_path), "resume_from": None,
           "threads": 2, "cuda_device": None, "project_dir": str(ROOT)}
    ctx = mp.get_context("fork")
    conn, child_conn = ctx.Pipe(duplex=True)
    life_read, life_write = ctx.Pipe(duplex=False)
    # (a fork inherits every descriptor: the child must drop the driver's ends, as the forkserver's children never had them)
    proc = ctx.Process(target=_trial_entry, args=(child_conn, life_read, job, [conn, life_write]))
    proc.start()
    child_conn.close()
    life_read.close()
    conn.send("go")  # its segment starts (the driver's runner says so once the start is recorded)
    assert conn.poll(60), "no epoch from the DDP trial"
    msg = conn.recv()
    assert msg[0] == "epoch" and msg[1] == 1
    ranks = _children(proc.pid)
    assert len(ranks) == 2, ranks
    return proc, conn, life_write, ranks


def _gone(pids: list[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_a_dead_rank_fails_the_trial_and_ends_the_other_ranks(tmp_path):
    proc, conn, life_write, ranks = _start_ddp_trial(tmp_path)
    os.kill(ranks[1], signal.SIGKILL)
    conn.send("continue")
    assert conn.poll(30)
    kind, info = conn.recv()
    assert kind == "fail" and "rank" in info["reason"], info
    proc.join(timeout=10)
    assert proc.exitcode is not None and _gone(ranks)
    life_write.close()


@pytest.mark.slow
def test_a_dead_driver_ends_every_rank(tmp_path):
    proc, conn, life_write, ranks = _start_ddp_trial(tmp_path)
    life_write.close()  # what the OS does when the driver dies, even by SIGKILL
    conn.close()
    assert _gone([proc.pid, *ranks]), "a process of the DDP trial outlived its driver"
    proc.join(timeout=5)
