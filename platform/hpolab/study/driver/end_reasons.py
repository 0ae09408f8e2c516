"""Why a trial ended as it did, in words: the fail reasons the driver records when a trial process
exits without a result, when Optuna recorded another end than the driver told, and where a trial's
metric values come from (events.py uses them)."""

from __future__ import annotations

import signal
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from hpolab.study.driver.heartbeat import REAPED
from hpolab.study.state.budget import FINISHED


def metrics_source(info: dict[str, Any]) -> str:
    """Where a trial's metric values come from, for a fail reason (the routine says: train/builtin.py)."""
    return info.get("metrics_from") or "what the experiment's train() reports"


def disagreement(frozen: FrozenTrial | None, state: TrialState, value: float | None, model_info: dict | None,
                 retry: str | None, tags: dict[str, str]) -> tuple[TrialState, float | None, dict | None, str | None]:
    """The tell failed, or Optuna has the trial in another state than the driver told (or cannot
    say): (state, value, model_info, retry) to go on with. MLflow records Optuna's state (FAIL when
    unknown or unfinished) with why in the tags, with no model and no retry (a reaped trial's retry
    was queued by the worker that reaped it; an unrecorded one is retried when it is reaped)."""
    actual = frozen.state if frozen is not None and frozen.state in FINISHED else TrialState.FAIL
    by = frozen.system_attrs.get(REAPED) if frozen is not None else None
    if frozen is not None and frozen.state == state and not by:  # it went through after all (its reply was lost)
        return state, value, model_info, retry
    if by:
        why, kind = f"reaped by another worker ({by}) while it still ran here; its retry runs there", "reaped"
    elif frozen is None or frozen.state not in FINISHED:
        why, kind = f"Optuna could not record its end ({tags.get('hpolab.tell_error')}); recorded FAIL", "tell"
    else:
        why, kind = f"Optuna recorded {actual.name} (told {state.name}, value {value!r})", "tell"
    if actual == TrialState.FAIL:
        here = tags.get("hpolab.fail_reason")
        tags["hpolab.fail_reason"] = why + (f" (here: {here})" if here and here != why else "")
        tags["hpolab.fail_kind"] = kind
    tags["hpolab.optuna_disagreed"] = f"told {state.name}, Optuna has {frozen.state.name if frozen is not None else 'unknown'}"
    return actual, (frozen.value if actual == TrialState.COMPLETE and frozen is not None else None), None, None


def exit_reason(code: int | None) -> str:
    """Why a trial process that sent no result ended, from its exit code (negative: a signal)."""
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        reason = f"trial process killed by {name}"
        if name == "SIGKILL":
            reason += " (by a user, the per-trial timeout or the kernel's OOM killer: check `dmesg`)"
        elif name == "SIGSEGV":
            reason += " (segmentation fault in native code)"
        return reason
    return f"trial process exited with code {code} before reporting a result"
