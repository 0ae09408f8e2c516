"""A trial on N devices (trainer.devices > 1): the trial process starts N rank processes and relays.

    driver <--pipe--> trial process (this module: starts the ranks, hosts the TCPStore, relays)
                        ├─ rank 0 <--pipe-->  the routine's train(config, trial) (train/builtin.py) with
                        │                     trial.ranks_of: fit(ranks=...) evaluates, checkpoints, reports
                        └─ rank 1..N-1 <--pipe-->  the same, with no report: train their share, follow rank 0

How the ranks start, and why not torch's elastic launcher: `elastic_launch` runs its own agent
that starts fresh interpreters (seconds each, importing torch again), restarts failed workers, and
only hands back return values at the end -- while a trial must answer the driver after every epoch,
must never be restarted behind the driver's back (the driver owns retries), and must die with its
driver. So the ranks are plain forks of this trial process (itself a fork of the warm forkserver:
torch and the experiment already imported, tens of milliseconds per rank), forked before this
process does any torch work or starts the TCPStore's thread, and before CUDA is initialized (each
rank initializes its own device). Rendezvous is a TCPStore this process serves on 127.0.0.1 on a
port the kernel picks (port 0: no free-port race); the ranks join it as clients.

Nothing is left behind: every rank dies with this process (PR_SET_PDEATHSIG) and with the driver
(the inherited lifeline); when a rank fails or dies, the others are killed at once and the trial
fails with that rank's reason; a pruned trial's ranks all stop after the same epoch and exit
before the driver hears "done".
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

from hpolab.study.trials.lifeline import ORPHAN_EXIT_CODE, watch_lifeline

STORE_TIMEOUT_S = 1800.0  # rendezvous and every collective; a backstop: a dead rank ends the others at once


def run_ranks(conn, lifeline, job: dict[str, Any], world: int, child: Any) -> None:
    """In the trial process: start `world` ranks, relay rank 0 <-> driver, report one outcome to the driver.

    `child`: the trial_process module (its report runs in every rank).
    """
    ctx = mp.get_context("fork")  # see the module docstring
    pipes = [ctx.Pipe(duplex=True) for _ in range(world)]
    procs = []
    for rank in range(world):
        p = ctx.Process(target=_rank_main, args=(rank, world, pipes, conn, lifeline, job, child), name=f"trial-rank{rank}", daemon=False)
        p.start()
        procs.append(p)
    ends = [agent_end for agent_end, _ in pipes]
    for _, rank_end in pipes:
        rank_end.close()
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=timedelta(seconds=STORE_TIMEOUT_S), wait_for_workers=False)
    try:
        for end in ends:
            end.send(store.port)
        outcome = _relay(conn, ends, procs)
    finally:
        for p in procs:  # on success they have exited already; otherwise none may outlive the trial
            if p.is_alive():
                p.kill()
            p.join()
    conn.send(outcome)
    conn.close()


def _relay(conn, ends: list, procs: list) -> tuple:
    """Forward rank 0's epochs to the driver and its answers back, until every rank is done or one failed."""
    done: dict[int, Any] = {}
    while len(done) < len(procs):
        waiting = [ends[r] for r in range(len(procs)) if r not in done]
        ready = wait(waiting + [procs[r].sentinel for r in range(len(procs)) if r not in done], timeout=1.0)
        for rank, end in enumerate(ends):
            if rank in done or end not in ready:
                continue
            try:
                msg = end.recv()
            except (EOFError, OSError):  # it exited (or was killed) without a result
                procs[rank].join(timeout=5)
                return ("fail", {"kind": "exception", "reason": f"rank {rank} of {len(procs)} {_how_it_ended(procs[rank].exitcode)} without a result"})
            if msg[0] == "epoch":
                end.send(_ask_driver(conn, msg))
            elif msg[0] == "fail":
                info = dict(msg[1])
                info["reason"] = f"rank {rank} of {len(procs)}: {info['reason']}"
                return ("fail", info)
            else:  # ("done", summary on rank 0, None on the others)
                done[rank] = msg[1]
        for rank, p in enumerate(procs):
            if rank not in done and p.exitcode is not None and not ends[rank].poll():
                return ("fail", {"kind": "exception", "reason": f"rank {rank} of {len(procs)} {_how_it_ended(p.exitcode)} without a result"})
    for p in procs:
        p.join()  # they exit right after "done": none is left when the driver hears it
    return ("done", done[0])


def _how_it_ended(code: int | None) -> str:
    if code is not None and code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _ask_driver(conn, msg) -> str:
    try:
        conn.send(msg)
        return conn.recv()
    except (EOFError, OSError):  # the driver is gone: the ranks die with this process (PDEATHSIG)
        os._exit(ORPHAN_EXIT_CODE)


def _die_with_parent() -> None:
    """SIGKILL this rank when the trial process dies, however it dies (Linux; elsewhere the lifeline only)."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (AttributeError, OSError):
        return
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(ORPHAN_EXIT_CODE)


def _rank_main(rank: int, world: int, pipes: list, driver_conn, lifeline, job: dict[str, Any], child: Any) -> None:
    _die_with_parent()
    driver_conn.close()  # only the trial process talks to the driver
    for i, (agent_end, rank_end) in enumerate(pipes):
        agent_end.close()
        if i != rank:
            rank_end.close()
    me = pipes[rank][1]
    watch_lifeline(lifeline)  # threads do not survive fork: watch the driver again
    import torch

    from hpolab.train.device import resolve_device
    from hpolab.train.distributed import close_ranks, init_ranks

    torch.set_num_threads(max(1, int(job["threads"]) // world))
    port = me.recv()

    def ranks_of(tcfg):
        if tcfg.device != "cpu" and torch.cuda.is_available():
            if torch.cuda.device_count() < world:
                raise ValueError(f"devices={world} but {torch.cuda.device_count()} GPU(s) visible to this trial")
            torch.cuda.set_device(rank)  # each rank its own device: cuda:rank of the trial's GPUs
        return init_ranks(rank, world, host="127.0.0.1", port=port, device=resolve_device(tcfg.device), timeout_s=STORE_TIMEOUT_S)

    def work():
        from hpolab.config.experiment import load_experiment, train_of
        from hpolab.study.trials.trial import Trial
        from hpolab.train import seed_everything

        exp = load_experiment(job["experiment"])
        # Rank 0's reports go to the driver through this process and wait for each answer (every rank
        # stops after the same epoch); its model is rebuilt from best.pt by the driver (export_model off).
        trial = Trial(me, {**job, "export_model": False, "pipelined_reports": False})
        trial.ranks_of = ranks_of  # the routine's capability: it trains as one of `world` ranks
        cfg = trial.config
        seed_everything(cfg["seed"], bool(cfg["trainer"].get("deterministic", False)))
        train_of(exp)(cfg, trial)
        close_ranks()
        return trial.summary(False, getattr(exp, "costs", None)) if rank == 0 else None

    child.report(me, work)
