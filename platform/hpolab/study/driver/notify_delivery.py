"""Delivering notifications to one target (config/notify.py): a bounded queue on a thread of its own.

    json     POST the event as JSON with X-Hpolab-Event, X-Hpolab-Delivery (the event's id: the same on
             every retry, so a receiver can drop a duplicate), and, with `secret_env`,
             X-Hpolab-Timestamp (unix seconds) and X-Hpolab-Signature: sha256=<hex>, the HMAC-SHA256 of
             "<timestamp>.<raw body>" under the secret (a receiver checks it and rejects old timestamps:
             forgery and replay)
    slack    POST {"text": "<one line>"} (a Slack-compatible incoming webhook)
    command  run the program with the event's JSON on stdin; exit 0 is delivered

A 2xx answer (exit 0) is delivered; anything else (refused, timed out, 5xx) is retried `retries`
times with backoff (1 s, 2 s, 4 s, ... at most 30 s), then dropped. Events go out one at a time in
the order they came, so a receiver sees them in order. `submit` never blocks: a full queue drops
the event. Every drop is counted (`on_drop`). Messages name the target by notify[i] and its host
only: a ${VAR} in a url or command, and the secret, are read from the environment when sending and
never printed, logged or stored.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from hpolab.config.notify import ENV_VAR, NotifyTarget

QUEUE_SIZE = 100  # events waiting per target; more are dropped (and counted)
MAX_BACKOFF_S = 30.0


class NotDelivered(Exception):
    """One attempt failed; the message names the target, never a secret."""


def expand(text: str) -> str:
    """`text` with each ${VAR} read from the environment (NotDelivered when one is not set)."""
    def value(m) -> str:
        if m[1] not in os.environ:
            raise NotDelivered(f"environment variable {m[1]} is not set")
        return os.environ[m[1]]

    return ENV_VAR.sub(value, text)


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """X-Hpolab-Signature's value: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">."""
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def body_of(target: NotifyTarget, payload: dict[str, Any]) -> bytes:
    if target.format == "slack":
        return json.dumps({"text": payload["text"]}).encode()
    return json.dumps(payload, sort_keys=True, default=str).encode()


def attempt(target: NotifyTarget, payload: dict[str, Any]) -> None:
    """One delivery attempt; NotDelivered says why it failed."""
    body = body_of(target, payload)
    if target.command is not None:
        _run_command(target, body)
        return
    headers = {"Content-Type": "application/json", "User-Agent": "hpolab", "X-Hpolab-Event": payload["event"],
               "X-Hpolab-Delivery": payload["id"]}
    if target.secret_env:
        secret = os.environ.get(target.secret_env)
        if not secret:
            raise NotDelivered(f"environment variable {target.secret_env} (secret_env) is not set")
        stamp = str(int(time.time()))
        headers.update({"X-Hpolab-Timestamp": stamp, "X-Hpolab-Signature": signature(secret.encode(), stamp, body)})
    request = urllib.request.Request(expand(target.url.strip()), data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=target.timeout) as answer:
            answer.read(1024)
    except urllib.error.HTTPError as e:
        raise NotDelivered(f"answered HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:  # refused, unreachable, timed out
        reason = getattr(e, "reason", e)
        raise NotDelivered(f"{type(reason).__name__ if not isinstance(reason, str) else reason}: not reached") from None


def _run_command(target: NotifyTarget, body: bytes) -> None:
    args = target.command if isinstance(target.command, list) else shlex.split(target.command)
    try:
        done = subprocess.run([expand(a) for a in args], input=body, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=target.timeout)
    except subprocess.TimeoutExpired:
        raise NotDelivered(f"did not finish in {target.timeout:g} s") from None
    except OSError as e:
        raise NotDelivered(f"could not start: {e.strerror}") from None
    if done.returncode != 0:
        raise NotDelivered(f"exited with code {done.returncode}")


class Delivery:
    """One target's queue and thread. `on_drop(describe, why)` is called for each event dropped."""

    def __init__(self, target: NotifyTarget, index: int, on_drop: Callable[[str, str], None]):
        self.target, self.name = target, target.describe(index)
        self.on_drop = on_drop
        self.queue: queue.Queue = queue.Queue(maxsize=QUEUE_SIZE)
        self.delivered = 0
        self.busy = False  # an event is being tried now
        self._closing = threading.Event()
        self._deadline: float | None = None  # after close(): retries stop at this time.monotonic()
        self._abandoned = False  # close() gave up waiting: what is left was counted there
        self._thread = threading.Thread(target=self._loop, name=f"notify-{index}", daemon=True)
        self._thread.start()

    def wants(self, event: str) -> bool:
        return event in self.target.events

    def submit(self, payload: dict[str, Any]) -> None:
        """Queue without waiting; a full queue drops it."""
        try:
            self.queue.put_nowait(payload)
        except queue.Full:
            self.on_drop(self.name, f"its queue of {QUEUE_SIZE} is full")

    def _loop(self) -> None:
        while True:
            payload = self.queue.get()
            if payload is None:
                return
            self.busy = True
            self._deliver(payload)
            self.busy = False

    def _deliver(self, payload: dict[str, Any]) -> None:
        why = ""
        for n in range(self.target.retries + 1):
            if n and not self._pause(min(2.0 ** (n - 1), MAX_BACKOFF_S)):
                break
            try:
                attempt(self.target, payload)
                self.delivered += 1
                return
            except NotDelivered as e:
                why = str(e)
        if not self._abandoned:  # (once close() has counted it as left undelivered, it is not counted again)
            self.on_drop(self.name, f"{payload['event']} not delivered: {why}")

    def _pause(self, seconds: float) -> bool:
        """Wait before a retry; False when the driver is ending and its wait for deliveries is over."""
        end = time.monotonic() + seconds
        while True:
            limit = end if self._deadline is None else min(end, self._deadline)
            left = limit - time.monotonic()
            if left <= 0:
                break
            if self._deadline is None:
                self._closing.wait(left)  # (close() wakes it: the wait is cut to the deadline)
            else:
                time.sleep(left)
        return self._deadline is None or time.monotonic() < self._deadline

    def close(self, deadline: float) -> int:
        """Stop taking events; wait until `deadline` (time.monotonic()) for those queued. Returns how
        many were left undelivered (the thread is a daemon: an attempt still hanging ends with the process)."""
        self._deadline = deadline
        self._closing.set()
        try:
            self.queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if not self._thread.is_alive():
            return 0
        self._abandoned = True
        return sum(1 for p in list(self.queue.queue) if p is not None) + int(self.busy)
