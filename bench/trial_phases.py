"""A trial segment's start, claim to first epoch, phase by phase: bench/trial_profile.py's timeline of
fresh trials and of resumed ones (a trial scheduler's paused trial, started again from its checkpoint).

The driver's side is timed where it runs (the claim, the run's start or resume, the spawn, the first
epoch message's arrival); the trial process's side by wrappers installed here before the study starts.
The forkserver is a fork of the profiling process (`hpolab study run`'s usual start), so every trial
process inherits them; each writes its marks to a file in a folder this module names, when it sends
its first epoch. All times are time.perf_counter(), CLOCK_MONOTONIC on Linux: one clock for every
process of the machine. A forkserver started as a new interpreter (HPOLAB_FORKSERVER=new) has no
wrappers: the trial's side is then left out.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
from pathlib import Path

_child: dict | None = None  # in a trial process: {"number": n, "marks": {...}, "folder": str}; None elsewhere


def _mark(name: str) -> None:
    if _child is not None:
        _child["marks"].setdefault(name, time.perf_counter())


def _wrap(owner, attr: str, before: str | None = None, after: str | None = None, then=None) -> None:
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def marked(*args, **kwargs):
        if before:
            _mark(before)
        out = fn(*args, **kwargs)
        if after:
            _mark(after)
        if then is not None:
            then(out)
        return out

    setattr(owner, attr, marked)


def install_child_marks(folder: Path) -> None:
    """Wrap the trial process's steps (in this process: the forkserver forked from it inherits them)."""
    from hpolab.config import experiment as experiment_mod
    from hpolab.study.trials import trial as trial_mod
    from hpolab.study.trials import trial_process
    from hpolab.train import epoch as epoch_mod
    from hpolab.train import loop, state

    run = trial_process.run

    @functools.wraps(run)
    def entry(conn, lifeline, job):
        global _child
        _child = {"number": job["number"], "marks": {"entry": time.perf_counter()}, "folder": str(folder), "written": False}
        return run(conn, lifeline, job)

    trial_process.run = entry

    def wrap_experiment(module) -> None:  # its data and model, once per process
        if _child is not None and not getattr(module, "_profiled", False):
            _wrap(module, "load_data", "data_start", "data_end")
            _wrap(module, "build_model", "model_start", "model_end")
            module._profiled = True

    _wrap(experiment_mod, "load_experiment", then=wrap_experiment)
    _wrap(loop, "fit", "fit_start")
    _wrap(loop, "_set_up", None, "set_up_end")
    _wrap(loop, "restore", "restore_start", "restore_end")
    _wrap(state, "load_checkpoint", None, "checkpoint_loaded")
    _wrap(epoch_mod, "to_device", "first_batch")
    send = trial_mod.Trial.report

    @functools.wraps(send)
    def on_epoch(self, epoch, metrics=None, checkpoint=None):
        _mark("sent")
        if _child is not None and not _child["written"]:
            _child["written"] = True
            path = Path(_child["folder"]) / f"{os.getpid()}.json"
            path.write_text(json.dumps({"number": _child["number"], "marks": _child["marks"]}))
        return send(self, epoch, metrics, checkpoint)

    trial_mod.Trial.report = on_epoch


class Segments:
    """The driver's marks per segment: claim, fork, start (fresh or resumed), go, first epoch message.

    Where the runner forks a trial's process before its segment starts (TrialRunner.prepare/_fork) the
    fork and the "go" are two marks; where spawn_trial forks and starts at once, both are its call.
    A trial that starts in the runner's standby process has its job sent where the fork was."""

    def __init__(self) -> None:
        self.list: list[dict] = []
        self.claim: tuple[float, float] | None = None

    # Recorder marks (trial_profile.py's targets chain them with its own)
    def claimed(self, rec, args, t0: float, t1: float) -> None:
        self.claim = (t0, t1)

    def started(self, kind: str):
        """Marks the segment its fork opened (the start's wrapper returns after the fork) fresh or resumed."""
        def mark(rec, args, t0: float, t1: float) -> None:
            number = args[1].number if kind == "fresh" else args[1].trial.number
            seg = self._open(number)
            if seg is not None and seg["kind"] is None:
                seg.update(kind=kind, start=t0)
        return mark

    def fork(self, rec, args, t0: float, t1: float) -> None:
        claim = self.claim or (t0, t0)
        self.list.append({"number": args[1].number, "kind": None, "claim": claim[0], "claimed": claim[1], "fork": t0, "forked": t1})
        self.claim = None

    def go(self, rec, args, t0: float, t1: float) -> None:
        seg = self._open(args[1].number)
        if seg is None or "go" in seg:  # (spawn_trial forked and started at once)
            self.fork(rec, args, t0, t1)
            seg = self.list[-1]
            seg["go"] = t1
        else:
            seg["go"] = t0

    def first_epoch(self, rec, args, t0: float, t1: float) -> None:
        seg = self._open(args[1].number)
        if seg is not None:
            seg["first_epoch"] = t0

    def _open(self, number: int) -> dict | None:
        for seg in reversed(self.list):
            if seg["number"] == number:
                return None if "first_epoch" in seg else seg
        return None


# (label, from mark, to mark): driver marks and the trial process's ("c." prefix)
PHASES = [
    ("claim (budget lock, ask or claim_paused)", "claim", "claimed"),
    ("claimed -> fork (config; a resume: checkpoint; without a prepared fork: the run too)", "claimed", "fork"),
    ("fork call on the driver (fork request, pipes; a standby: its job sent)", "fork", "forked"),
    ("forked -> go (run made or run state, segment_started)", "forked", "go"),
    ("fork -> trial process entry (a standby: job sent -> entry)", "fork", "c.entry"),
    ("entry -> data (experiment lookup, config, seed; a resume: the trial object reads the checkpoint)", "c.entry", "c.data_start"),
    ("data: experiment.load_data (blank: a standby preloaded it before the claim)", "c.data_start", "c.data_end"),
    ("model: experiment.build_model", "c.model_start", "c.model_end"),
    ("fit set-up (device, batches, optimizer, schedule)", "c.fit_start", "c.set_up_end"),
    ("fit's own read of the checkpoint (blank: it takes trial.resume_checkpoint)", "c.restore_start", "c.checkpoint_loaded"),
    ("model, optimizer, RNG state from it", "c.checkpoint_loaded", "c.restore_end"),
    ("fit's restore, in all", "c.restore_start", "c.restore_end"),
    ("set up -> first batch (waits for go)", "c.last_set_up", "c.first_batch"),
    ("go -> first batch", "go", "c.first_batch"),
    ("first epoch (train + evaluate + last.pt)", "c.first_batch", "c.sent"),
    ("first epoch message -> driver", "c.sent", "first_epoch"),
    ("CLAIM -> FIRST EPOCH STARTS (first batch)", "claim", "c.first_batch"),
]


def _child_records(folder: Path) -> list[dict]:
    out = []
    for p in sorted(folder.glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            pass
    return out


def timeline(segments: Segments, folder: Path) -> dict[str, dict[str, float]]:
    """{kind: {phase: mean seconds}} over fresh segments (the first left out: the forkserver's warm-up) and resumes."""
    children = _child_records(folder)
    rows: dict[str, list[dict]] = {"fresh": [], "resume": []}
    for i, seg in enumerate(segments.list):
        if "first_epoch" not in seg or i == 0:
            continue
        marks = dict(seg)
        near = [c for c in children if c["number"] == seg["number"] and seg["fork"] <= c["marks"]["entry"] <= seg["first_epoch"]]
        if near:
            m = near[0]["marks"]
            marks.update({f"c.{k}": v for k, v in m.items()})
            marks["c.last_set_up"] = m.get("restore_end", m.get("set_up_end"))
        if seg["kind"] in rows:  # (None: a restart after an OOM)
            rows[seg["kind"]].append(marks)
    out: dict[str, dict[str, float]] = {}
    for kind, segs in rows.items():
        if not segs:
            continue
        out[kind] = {"segments": len(segs)}
        for label, a, b in PHASES:
            spans = [s[b] - s[a] for s in segs if s.get(a) is not None and s.get(b) is not None]
            if spans:
                out[kind][label] = statistics.fmean(spans)
    return out


def print_timeline(tl: dict[str, dict[str, float]]) -> None:
    kinds = list(tl)
    print("\nsegment start, claim to first epoch (mean ms; fresh: trials 1..n-1; resume: every resumed segment)\n")
    print("| phase | " + " | ".join(f"{k} ({int(tl[k]['segments'])})" for k in kinds) + " |")
    print("| --- | " + " | ".join("---:" for _ in kinds) + " |")
    for label, _, _ in PHASES:
        cells = [f"{1000 * tl[k][label]:.0f}" if label in tl[k] else "" for k in kinds]
        print(f"| {label} | " + " | ".join(cells) + " |")
