"""The child side of a trial: one OS process, forked from a pre-warmed forkserver.

It runs the experiment's `train(config, trial)` (trial.py: the experiment's own loop, or the
platform's routine over its data and model, train/builtin.py), and talks to the driver only through
its pipe:

    child -> driver                          driver -> child
                                             "go"                  (once: its segment has started)
    ("epoch", epoch, metrics)                "continue" | "stop"   (after every epoch)
    ("done", summary) | ("fail", details)
    ("model", path) | ("model_error", why)   "export" | "skip"     (after "done", when the spec logs models: child_export.py)

The process is forked before its segment starts, and trains only once the driver's "go" comes
(after the driver recorded the start: the run, the lifecycle's segment_started). A `train` whose
set-up writes nothing (the routine's: `sets_up_before_go`) builds its data, model and checkpoint
state meanwhile; any other, and a trial on several devices, waits for "go" first. Before it, the
process writes nothing anywhere. How a trial's reports wait (or not) for the driver's answer:
trial.py and reports.py.

A standby process (runner.py) is forked before the driver claims its trial: it gets as far as it can
without one (the experiment imported, the spec's data loaded when its train can `preload` it) and
waits for its job, the first message on its pipe; then it runs as any trial process.

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

# The routine's modules, which train/builtin.py imports only when it trains (the driver checks a spec
# without them): imported here, once in the forkserver, instead of in every trial process (tens of ms each).
import torch.utils.serialization.config  # noqa: F401  -- torch.save/torch.load import it on first use
import hpolab.train.loop  # noqa: F401
import hpolab.train.losses  # noqa: F401
import hpolab.train.tasks  # noqa: F401
from hpolab.study.trials.child_export import offer_export
from hpolab.study.trials.gpu_memory import watch_gpu_memory
from hpolab.study.trials.lifeline import watch_lifeline
from hpolab.study.trials.trial import TrialFailure, await_go, run_trial
from hpolab.train import NonFiniteLossError


def _ignore_stop_signals() -> None:
    # Ctrl-C (sent to the whole process group) and SIGTERM are the driver's to handle (graceful stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def stand_by(conn, lifeline, ready: dict[str, Any]) -> dict[str, Any]:
    """A standby's wait: get ready for a trial of the study (`ready`: experiment, project_dir,
    cuda_device, threads, preload), then return the job the driver sends. A driver that is gone, or that drops
    the standby (its pipe closes), ends the process: it has written nothing."""
    _ignore_stop_signals()
    watch_lifeline(lifeline)
    if ready.get("cuda_device") is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(ready["cuda_device"])  # before CUDA initializes (the job's is the same)
    if ready.get("project_dir") and ready["project_dir"] not in sys.path:
        sys.path.insert(0, ready["project_dir"])
    torch.set_num_threads(int(ready.get("threads") or 1))  # (a trial given other threads loads its own data)
    if ready.get("preload") is not None:
        _preload(ready["experiment"], ready["preload"])
    try:
        return conn.recv()
    except (EOFError, OSError):
        os._exit(0)


def _preload(experiment: str, preload: dict[str, Any]) -> None:
    """The spec's data, loaded by the experiment's train's `preload` (train/builtin.py) while no trial
    waits for it. Any failure is left to the trial, which loads the data again and says why."""
    try:
        from hpolab.config.experiment import load_experiment, train_of

        keep = getattr(train_of(load_experiment(experiment)), "preload", None)
        if keep is not None:
            keep(preload["data"], preload["data_seed"])
    except Exception:  # noqa: BLE001 -- see above
        pass


def run(conn, lifeline, job: dict[str, Any]) -> None:
    """Process entry point. `job` is plain data (picklable): built by the driver's trial runner."""
    _ignore_stop_signals()
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
    run_trial(conn, job, report, offer_export)


def work_in(folder: str) -> None:
    """The trial runs in its own folder (STORE/trials/<study>/trial-<n>): what its code writes to a
    relative path (an `output_dir="out"`, a `save_model("best")`, Lightning's lightning_logs/) is its
    own, never a parallel trial's. The import path keeps pointing where it did (its relative entries,
    the working directory's "" among them, made absolute first)."""
    here = os.getcwd()
    sys.path[:] = [os.path.join(here, p) if not os.path.isabs(p) else p for p in sys.path]
    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)


def report(conn, work, close: bool = True) -> dict[str, Any] | None:
    """Run `work()` and send its outcome: ("done", summary) or ("fail", details); then close the pipe
    (unless `close` is False: the caller still has to talk). Returns the summary sent (None: a failure)."""
    try:
        summary = work()
        _flush_output()
        conn.send(("done", summary))
        return summary
    except TrialFailure as e:  # a loop broke the trial's contract (trial_contract.py): the one line says how
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
