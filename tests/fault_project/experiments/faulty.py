"""A test experiment whose model misbehaves on request (for the failure-isolation tests).

Real data (sklearn digits, flattened) and a tiny MLP. `model.fault` picks the misbehaviour, after
`model.fault_after` forward calls (about 9 per epoch at batch 128):
  none | raise (Python exception) | nan (NaN logits) | sigkill (the process kills itself) |
  segfault (a real SIGSEGV) | hang (sleeps for an hour: for the per-trial timeout) |
  hold (waits while the file that HPOLAB_TEST_HOLD names exists: a test removes it when it is done) |
  exit_after_epoch (the process exits right after sending its first epoch to the driver, so the
  driver's "continue" meets a closed pipe; fault_after is ignored)
`model.sleep` slows every forward call (seconds), to make trials slow enough to interrupt.
`model.linger` keeps the process alive that many seconds after the trial sent its result (a slow exit:
the driver retires it while it is still running).
If HPOLAB_TEST_PID_DIR is set, each model writes its process id there (to find orphans).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hpolab.train.data import DataSplits
from hpolab.train.sklearn_data import load_digits

DATA_DEFAULTS: dict = {}
MODEL_DEFAULTS = {"hidden": 32, "fault": "none", "fault_after": 0, "sleep": 0.0, "linger": 0.0}


def load_data(data: dict, seed: int) -> DataSplits:
    images, target = load_digits()
    x = torch.tensor(images.reshape(len(images), -1), dtype=torch.float32) / 16.0
    y = torch.tensor(target, dtype=torch.long)
    idx = torch.from_numpy(np.random.default_rng(seed).permutation(len(y)))
    tr, va, te = idx[:1000], idx[1000:1400], idx[1400:]
    return DataSplits(
        train=TensorDataset(x[tr], y[tr]), val=TensorDataset(x[va], y[va]), test=TensorDataset(x[te], y[te]),
        num_classes=10, input_shape=(64,),
    )


class Faulty(nn.Module):
    def __init__(self, hidden: int, fault: str, fault_after: int, sleep: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        self.fault, self.fault_after, self.sleep, self.calls = fault, fault_after, sleep, 0

    def forward(self, x):
        self.calls += 1
        if self.sleep:
            time.sleep(self.sleep)
        if self.fault != "none" and self.calls > self.fault_after:
            if self.fault == "raise":
                print(f"forward call {self.calls}: raising on purpose", flush=True)  # (a failed trial's last output)
                raise RuntimeError("the experiment's model raised on purpose")
            if self.fault == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fault == "segfault":
                ctypes.string_at(0)  # reads address 0: a real segmentation fault
            if self.fault == "nan":
                return self.net(x) * float("nan")
            if self.fault == "hang":
                time.sleep(3600)
            while self.fault == "hold" and os.path.exists(os.environ["HPOLAB_TEST_HOLD"]):
                time.sleep(0.05)
        return self.net(x)


def build_model(model: dict, input_shape, num_classes) -> nn.Module:
    pid_dir = os.environ.get("HPOLAB_TEST_PID_DIR")
    if pid_dir:
        open(os.path.join(pid_dir, f"{os.getpid()}.pid"), "w").close()
    if float(model.get("linger", 0)):
        from multiprocessing import util

        # run by the process's exit (multiprocessing's exit function), after the result was sent
        util.Finalize(None, time.sleep, args=(float(model["linger"]),), exitpriority=100)
    if model["fault"] == "exit_after_epoch":
        _exit_after_first_epoch_message()
        return Faulty(int(model["hidden"]), "none", 0, float(model["sleep"]))
    return Faulty(int(model["hidden"]), model["fault"], int(model["fault_after"]), float(model["sleep"]))


def _exit_after_first_epoch_message() -> None:
    """Die the moment the trial has sent its ("epoch", ...) message: the driver answers a dead child."""
    from multiprocessing.connection import Connection

    send = Connection.send

    def send_then_exit(self, obj):
        send(self, obj)
        if isinstance(obj, tuple) and obj and obj[0] == "epoch":
            os._exit(3)

    Connection.send = send_then_exit
