"""The child side of a trial: one OS process, forked from a pre-warmed forkserver.

It builds the experiment's data and model from the resolved config, runs the shared training
routine (or the experiment's own `train(config, trial)`: own_loop.py), and talks to the driver only
through its pipe:

    child -> driver                          driver -> child
                                             "go"                  (once: its segment has started)
    ("epoch", epoch, metrics)                "continue" | "stop"   (after every epoch)
    ("done", summary) | ("fail", details)
    ("model", path) | ("model_error", why)   "export" | "skip"     (after "done", when the spec logs models: child_export.py)

The process is forked before its segment starts: it builds the experiment's data and model, fit's
set-up and the checkpoint's state while the driver records the start (the run, the lifecycle's
segment_started), and trains only once the driver's "go" comes (an own loop and a trial on several
devices wait for it first: their set-up is their code's). Before it, it writes nothing anywhere.

The trial does not wait for an epoch's answer: it trains the next epoch meanwhile, reads the answer
between that epoch's batches, and waits for it only before that epoch's checkpoints are written (the
driver stages the previous ones for upload before it answers) and after its last epoch (EpochAnswers).
A "stop" abandons the epoch in progress: a pruned trial ends within a batch of the driver's decision,
and the driver's bookkeeping (MLflow, Optuna, another trial's epoch) never holds up its training.

It never writes to Optuna or MLflow (its model it saves to a local folder): the driver is the only
writer to both stores. A lifeline pipe (whose other end only the driver holds) ends the process
within a second of the driver dying, so no orphan keeps a GPU busy.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Any

import torch  # imported here so the forkserver that preloads this module has torch warm
import torch._dynamo  # noqa: F401  -- torch.optim's constructors import it lazily (~3 s); pay it once, in the forkserver

from hpolab.study.trials.child_export import offer_export
from hpolab.study.trials.gpu_memory import watch_gpu_memory
from hpolab.study.trials.lifeline import ORPHAN_EXIT_CODE, watch_lifeline
from hpolab.study.trials.own_loop import TrialFailure, run_own_loop
from hpolab.train import NonFiniteLossError, fit, seed_everything
from hpolab.train.config import trainer_config
from hpolab.train.data import data_seed_of
from hpolab.train.tasks import task_for



def _input_example(data, n: int = 2):
    """A couple of real validation inputs: the logged model's input example and signature."""
    xs = [data.val[i][0] for i in range(min(n, len(data.val)))]
    return torch.stack([torch.as_tensor(x) for x in xs]).float()


def run(conn, lifeline, job: dict[str, Any]) -> None:
    """Process entry point. `job` is plain data (picklable): built by the driver's trial runner."""
    # Ctrl-C (sent to the whole process group) and SIGTERM are the driver's to handle (graceful stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch_lifeline(lifeline)
    if job.get("cuda_device") is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(job["cuda_device"])  # before CUDA initializes
        watch_gpu_memory(job["checkpoint_dir"])  # its run's system/gpu_0_* metrics (system_metrics.py)
    project_dir = job["project_dir"]
    if project_dir not in sys.path:
        sys.path.insert(0, project_dir)
    work_in(job["checkpoint_dir"])
    devices = int(job["config"]["trainer"].get("devices", 1))
    if devices > 1:  # one process per device (DDP); this process relays between rank 0 and the driver
        from hpolab.study.trials.ranks import run_ranks

        await_go(conn)
        run_ranks(conn, lifeline, job, devices, sys.modules[__name__])
        return
    torch.set_num_threads(int(job["threads"]))
    from hpolab.config.experiment import is_own_loop, load_experiment

    try:
        experiment = load_experiment(job["experiment"])
    except Exception:  # train() below loads it again and reports why it cannot, as the trial's failure
        experiment = None
    if experiment is not None and is_own_loop(experiment):  # its train(config, trial) instead of fit()
        await_go(conn)
        run_own_loop(conn, job, experiment, report, offer_export)
        return

    def work() -> dict[str, Any] | None:
        answers = EpochAnswers(conn, awaiting_go=True)
        summary = train(job, answers.on_epoch, stop_requested=answers.stop_requested)
        if summary is not None and job.get("export_model"):
            summary["export_in_child"] = True  # this process waits for the driver's "export" | "skip"
        return summary

    summary = report(conn, work, close=False)
    try:
        offer_export(conn, job, summary)  # the model is saved here while the driver starts the next trial
    finally:
        conn.close()


def work_in(folder: str) -> None:
    """The trial runs in its own folder (STORE/trials/<study>/trial-<n>): what its code writes to a
    relative path (an `output_dir="out"`, a `save_model("best")`, Lightning's lightning_logs/) is its
    own, never a parallel trial's. The import path keeps pointing where it did (its relative entries,
    the working directory's "" among them, made absolute first)."""
    here = os.getcwd()
    sys.path[:] = [os.path.join(here, p) if not os.path.isabs(p) else p for p in sys.path]
    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)


def await_go(conn) -> None:
    """Wait for the driver's "go" (its segment has started); a driver that is gone, or that says
    anything else (it dropped this start), ends the process: it has trained and written nothing."""
    try:
        go = conn.recv()
    except (EOFError, OSError):
        os._exit(ORPHAN_EXIT_CODE)
    if go != "go":
        os._exit(0)


class EpochAnswers:
    """fit()'s on_epoch and stop_requested for one trial process: an epoch's metrics are sent and
    training goes on; the driver's "continue" | "stop" is read when fit asks (loop.py says when).
    awaiting_go: the driver's "go" is read first, when fit first asks (before its first batch: its
    set-up is done by then) or sends an epoch."""

    def __init__(self, conn, awaiting_go: bool = False):
        self.conn = conn
        self.awaiting_go = awaiting_go
        self.pending = False  # an epoch was sent and its answer not read yet
        self.stop = False

    def _go(self) -> None:
        if self.awaiting_go:
            self.awaiting_go = False
            await_go(self.conn)

    def on_epoch(self, epoch: int, metrics: dict[str, float]) -> bool:
        self._go()
        try:
            self.conn.send(("epoch", epoch, metrics))
        except (EOFError, OSError):  # the driver is gone (its end closed or reset): nobody to train for
            os._exit(ORPHAN_EXIT_CODE)
        self.pending = True
        return False

    def stop_requested(self, wait: bool) -> bool:
        self._go()
        try:
            if self.pending and (wait or self.conn.poll()):
                self.stop, self.pending = self.conn.recv() == "stop", False
        except (EOFError, OSError):
            os._exit(ORPHAN_EXIT_CODE)
        return self.stop


def ask_driver(conn):
    """fit()'s on_epoch for a trial on several devices (ranks.py): send the epoch's metrics, wait for
    "continue" or "stop" (every rank must stop after the same epoch, so rank 0 waits)."""

    answers = EpochAnswers(conn)

    def on_epoch(epoch: int, metrics: dict[str, float]) -> bool:
        answers.on_epoch(epoch, metrics)
        return answers.stop_requested(wait=True)

    return on_epoch


def train(job: dict[str, Any], on_epoch, ranks_of=None, stop_requested=None) -> dict[str, Any] | None:
    """Build the experiment's data and model, fit(); the summary the driver logs (None on ranks other than 0).

    ranks_of(cfg): this process's Ranks when it is one of several (ranks.py), called before the model is built.
    stop_requested: fit()'s, with an on_epoch that does not wait (EpochAnswers); one process only.
    """
    from hpolab.config.experiment import load_experiment

    cfg = job["config"]
    exp = load_experiment(job["experiment"])
    tcfg = trainer_config(cfg["trainer"])
    ranks = ranks_of(tcfg) if ranks_of is not None else None
    # Seed before the model is built: its initial weights come from the global RNG, which a
    # forked process would otherwise inherit unseeded (then no trial could be reproduced).
    seed_everything(cfg["seed"], bool(cfg["trainer"].get("deterministic", False)))
    data = exp.load_data(cfg["data"], data_seed_of(cfg))  # the split: the study's data seed, not the training seed
    model = exp.build_model(cfg["model"], data.input_shape, data.num_classes)
    notes: list[str] = []
    result = fit(
        tcfg,
        model,
        data,
        metric=cfg["metric"],
        direction=cfg["direction"],
        seed=cfg["seed"],
        on_epoch=on_epoch,
        checkpoint_dir=job["checkpoint_dir"],
        resume_from=job.get("resume_from"),
        log=notes.append,
        task=task_for(exp),  # the experiment's TASK: its loss, metrics and target checks
        ranks=ranks,
        stop_requested=stop_requested,
    )
    if ranks is not None and not ranks.is_rank0:
        return None
    example = _input_example(data)
    objectives = _objective_values(cfg, result, model, example, getattr(exp, "costs", None)) if cfg.get("objectives") else None
    model_cpu = model.to("cpu").eval()
    with torch.inference_mode():
        out = model_cpu(example)
    return {
        "best_value": result.best_value,
        "best_epoch": result.best_epoch,
        "epochs_run": result.epochs_run,
        "stop_reason": result.stop_reason,
        "best_checkpoint": str(result.best_checkpoint) if result.best_checkpoint else None,
        "last_checkpoint": str(result.last_checkpoint) if result.last_checkpoint else None,
        "last_checkpoint_epoch": result.epochs_run if result.last_checkpoint else None,  # (fit writes last.pt every epoch)
        "model_from_checkpoint": True,  # the routine's capability: its model is rebuilt from best.pt (build_model)
        "amp": result.amp,
        "device": result.device,
        "devices": tcfg.devices,
        "input_shape": list(data.input_shape),
        "num_classes": data.num_classes,
        "input_example": example.numpy(),
        "output_example": out.float().numpy(),
        "notes": notes,
        "objectives": objectives,
    }


def _objective_values(cfg: dict[str, Any], result, model, example, own_costs=None) -> dict[str, float]:
    """For a study with `objectives:`/`constraints:`: every epoch metric at the best epoch (picked
    by the pruning metric) and the cost metrics it asks for, measured now on the trial's device."""
    from hpolab.train.costs import cost_metrics

    at_best = next((h for h in result.history if h.get("epoch") == result.best_epoch), result.last_metrics)
    values = {k: float(v) for k, v in at_best.items() if k != "epoch"}
    values.update(cost_metrics(cfg["cost_metrics"], model, example, torch.device(result.device), own_costs))
    return values


def report(conn, work, close: bool = True) -> dict[str, Any] | None:
    """Run `work()` and send its outcome: ("done", summary) or ("fail", details); then close the pipe
    (unless `close` is False: the caller still has to talk). Returns the summary sent (None: a failure)."""
    try:
        summary = work()
        _flush_output()
        conn.send(("done", summary))
        return summary
    except TrialFailure as e:  # an own loop broke its contract (own_loop.py): the one line says how
        _flush_output()
        conn.send(("fail", {"kind": e.kind, "reason": str(e), "traceback": ""}))
    except NonFiniteLossError as e:
        _flush_output()
        conn.send(("fail", {"kind": "nan", "reason": str(e), "traceback": traceback.format_exc()}))
    except torch.cuda.OutOfMemoryError as e:
        summary = torch.cuda.memory_summary() if torch.cuda.is_available() else ""
        conn.send(("fail", {"kind": "oom", "reason": f"CUDA out of memory: {e}", "traceback": traceback.format_exc(), "memory_summary": summary}))
    except Exception as e:  # any error in the experiment or routine fails this trial only
        _flush_output()
        conn.send(("fail", {"kind": "exception", "reason": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}))
    finally:
        if close:
            conn.close()
    return None


def _flush_output() -> None:
    """What the trial printed reaches its output pipe before its result reaches the driver (trial_output.py)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
