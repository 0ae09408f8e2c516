"""Notifications (the spec's `notify:`) against a real HTTP receiver on loopback.

The receiver is Python's http.server in a thread of the test process: it records each request's
headers and body, and can answer 500 or block until the test lets it go. First the delivery and its
rules without a study (signatures, retries with the same delivery id, order, a receiver that is down
or slow); then real studies through the CLI: the events in order with valid signatures, a Slack
target, a command target, secrets from the environment that never show, the study's wall time when
the receiver is slow, down or failing (asserted by what happens first, not by timing), two workers
that send each study event once, and `study set` / `promote` sending control_changed / champion_changed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mlflow import MlflowClient

from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, open_study, run_cli, start_cli, wait_for_checkpoints
from hpolab.config.notify import NotifyTarget
from hpolab.study.driver.notify_delivery import Delivery, signature
from services import free_port

SECRET = "hmac-Key-0f-the-Hook"
TOKEN = "path-Token-9a8b7c"


class Receiver:
    """A loopback HTTP receiver: `mode` ok | fail (500) | block (waits for release())."""

    def __init__(self, mode: str = "ok"):
        self.mode, self.requests, self.entered = mode, [], 0
        self.released = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.entered += 1
                if receiver.mode == "block":
                    receiver.released.wait(120)
                receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                self.send_response(500 if receiver.mode == "fail" else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, path: str | None = None) -> list[str]:
        return [json.loads(r["body"])["event"] for r in self.requests if path is None or r["path"] == path and "event" in json.loads(r["body"])]

    def payloads(self, path: str = "/hook") -> list[dict]:
        return [json.loads(r["body"]) for r in self.requests if r["path"] == path]

    def close(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def valid_signature(request: dict, secret: str) -> bool:
    """What a receiver checks: HMAC-SHA256 of "<timestamp>.<raw body>", compared in constant time."""
    stamp, sent = request["headers"]["X-Hpolab-Timestamp"], request["headers"]["X-Hpolab-Signature"]
    expected = "sha256=" + hmac.new(secret.encode(), stamp.encode() + b"." + request["body"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(sent, expected) and abs(time.time() - int(stamp)) < 300


# ---------------------------------------------------------------- delivery, no study


def test_targets_are_checked_and_named_without_their_secrets():
    with pytest.raises(ValueError, match="either url: .* or command:"):
        NotifyTarget(url="https://x.example", command="cat")
    with pytest.raises(ValueError, match="format: slack needs a url"):
        NotifyTarget(command="cat", format="slack")
    with pytest.raises(ValueError, match="name of an environment variable"):
        NotifyTarget(url="https://x.example", secret_env="s3cr3t-value!")
    with pytest.raises(ValueError, match="not an http"):
        NotifyTarget(url="ftp://x.example/hook")
    with pytest.raises(ValueError, match="a login in the url would be recorded"):
        NotifyTarget(url="https://user:pw@hooks.example.com/hook")
    t = NotifyTarget(url="https://${USER_}:${PW}@hooks.example.com/services/${TOKEN}", secret_env="HOOK", events=["new_best", "new_best"])
    assert t.events == ["new_best"] and t.variables() == ["USER_", "PW", "TOKEN", "HOOK"]
    assert t.describe(2) == "notify[2] (https://hooks.example.com/...)"
    assert NotifyTarget(url="${SLACK_URL}", format="slack").describe(0) == "notify[0] (a url from the environment)"


def test_the_signature_is_the_hmac_of_timestamp_dot_body():
    body = b'{"event": "new_best"}'
    assert signature(b"k", "1700000000", body) == "sha256=" + hmac.new(b"k", b"1700000000." + body, hashlib.sha256).hexdigest()


def _payload(event: str, n: int = 0) -> dict:
    return {"event": event, "id": f"id-{event}-{n}", "study": "s", "text": f"hpolab: {event} {n}"}


def test_events_arrive_in_order_signed(receiver, monkeypatch):
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    drops = []
    d = Delivery(NotifyTarget(url=receiver.url + "/hook", secret_env="HOOK_SECRET"), 0, lambda n, why: drops.append(why))
    for i in range(20):
        d.submit(_payload("trial_failed", i))
    assert d.close(time.monotonic() + 60) == 0 and drops == []
    assert [json.loads(r["body"])["id"] for r in receiver.requests] == [f"id-trial_failed-{i}" for i in range(20)]
    assert all(valid_signature(r, SECRET) for r in receiver.requests)
    assert not valid_signature(receiver.requests[0], "another secret")


def test_the_receiver_check_in_the_docs_accepts_a_real_signature_only(receiver, monkeypatch):
    """docs/how-to/notify.md's verify() on a request the delivery really sent."""
    import re

    page = (FAULT_PROJECT.parents[1] / "docs" / "how-to" / "notify.md").read_text()
    code = re.search(r"```python\n(import hashlib.*?)```", page, re.S)[1]
    space: dict = {}
    exec(code, space)
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    d = Delivery(NotifyTarget(url=receiver.url + "/hook", secret_env="HOOK_SECRET"), 0, lambda n, why: None)
    d.submit(_payload("study_finished"))
    assert d.close(time.monotonic() + 60) == 0
    r = receiver.requests[0]
    stamp, sent = r["headers"]["X-Hpolab-Timestamp"], r["headers"]["X-Hpolab-Signature"]
    assert space["verify"](SECRET.encode(), stamp, sent, r["body"])
    assert not space["verify"](b"another secret", stamp, sent, r["body"])
    assert not space["verify"](SECRET.encode(), stamp, sent, r["body"] + b" ")  # a changed body
    assert not space["verify"](SECRET.encode(), str(int(stamp) - 3600), sent, r["body"])  # another (old) timestamp


def test_a_failing_receiver_gets_retries_of_the_same_delivery_then_it_is_dropped():
    failing = Receiver("fail")
    try:
        drops = []
        d = Delivery(NotifyTarget(url=failing.url + "/hook", retries=2), 0, lambda n, why: drops.append(f"{n}: {why}"))
        d.submit(_payload("new_best"))
        assert d.close(time.monotonic() + 60) == 0
        assert [r["headers"]["X-Hpolab-Delivery"] for r in failing.requests] == ["id-new_best-0"] * 3  # 1 + 2 retries
        assert drops == [f"notify[0] (http://127.0.0.1/...): new_best not delivered: answered HTTP 500"]
    finally:
        failing.close()


def test_a_slow_receiver_holds_nothing_but_its_own_thread():
    slow = Receiver("block")
    try:
        d = Delivery(NotifyTarget(url=slow.url + "/hook", timeout=30), 0, lambda n, why: None)
        t0 = time.monotonic()
        for i in range(3):
            d.submit(_payload("trial_failed", i))  # (returns at once: the receiver holds the first)
        submitted = time.monotonic() - t0
        deadline = time.monotonic() + 1.0
        left = d.close(deadline)
        assert slow.entered == 1 and slow.requests == [] and left == 3  # still blocked; all three counted undelivered
        assert submitted < 1.0 and time.monotonic() - deadline < 1.0  # (close waited for its deadline, not the receiver)
    finally:
        slow.close()


# ---------------------------------------------------------------- studies through the CLI

ARGS = [FAULT_SPEC, "trainer.max_epochs=2", "log_models=none", "pruner={type: none}",
        "search_space={model.fault: {type: categorical, choices: [none, raise]}}",
        "enqueue=[{model.fault: raise}, {model.fault: none}]"]


def _notify(*targets: str) -> str:
    return "notify=[" + ", ".join(targets) + "]"


def _env(**extra) -> dict:
    return {**hpolab_env(), "HOOK_SECRET": SECRET, "HOOK_TOKEN": TOKEN, **extra}


def test_a_study_sends_its_events_in_order_signed_to_json_slack_and_command_targets(store, receiver, tmp_path):
    got = tmp_path / "command.jsonl"
    command = f"[{sys.executable}, -c, \"import sys; open('{got}', 'a').write(sys.stdin.read() + chr(10))\"]"
    out = run_cli("--store", str(store), "study", "run", *ARGS, "name=notes", "n_trials=2", _notify(
        f"{{url: '{receiver.url}/hook', secret_env: HOOK_SECRET}}",
        f"{{url: '{receiver.url}/${{HOOK_TOKEN}}', format: slack, events: [study_finished]}}",
        f"{{command: {command}, events: [study_started, study_finished]}}"), cwd=FAULT_PROJECT, env=_env())
    events = receiver.events("/hook")
    assert events == ["study_started", "trial_failed", "new_best", "study_finished"], out.stdout
    assert all(valid_signature(r, SECRET) for r in receiver.requests if r["path"] == "/hook")
    started, failed, best, finished = receiver.payloads()
    assert {started["study"], failed["study"]} == {"notes"} and started["links"]["ui_command"].endswith(" ui")
    assert failed["trial"] == 0 and "RuntimeError: the experiment's model raised on purpose" in failed["reason"]
    assert any("raise RuntimeError" in line for line in failed["log_tail"]), failed["log_tail"]  # its traceback's last lines
    assert any("raising on purpose" in line for line in failed["output_tail"]), failed["output_tail"]  # what it printed last
    assert (best["trial"], best["metric"], best["params"]) == (1, "val_acc", {"model.fault": "none"})
    _, study = open_study(store, "notes")
    assert best["value"] == study.best_value and finished["best"]["trial"] == 1
    assert finished["trials"]["complete"] == 1 and finished["trials"]["fail"] == 1 and finished["reason"] == "2/2 trials finished"
    slack = [r for r in receiver.requests if r["path"] == f"/{TOKEN}"]  # ${HOOK_TOKEN} read from the environment
    assert len(slack) == 1 and json.loads(slack[0]["body"]) == {"text": finished["text"]}
    assert finished["text"].startswith("hpolab: study notes finished (2/2 trials finished): 1 complete, 0 pruned, 1 failed; best val_acc")
    assert [json.loads(x)["event"] for x in got.read_text().split("\n") if x] == ["study_started", "study_finished"]
    # the secrets never show: not in the output, nor in either store, nor in the artifacts
    for where, text in [("output", out.stdout + out.stderr)] + [(p.name, p.read_bytes().decode("latin-1")) for p in store.rglob("*") if p.is_file()]:
        assert SECRET not in text and TOKEN not in text, where
    assert "${HOOK_TOKEN}" in (store / "optuna.db").read_bytes().decode("latin-1")  # (the recorded target: its template)
    # `study set` tells the same targets (control_changed), from another working directory
    run_cli("--store", str(store), "study", "set", "notes", "n_trials=3", cwd=tmp_path, env=_env())
    control = receiver.payloads()[-1]
    assert control["event"] == "control_changed" and control["control"]["values"] == {"n_trials": 3}
    assert valid_signature(receiver.requests[-1], SECRET)


def test_a_study_stopped_by_its_failure_limit_sends_study_error_not_finished(store, receiver):
    args = [FAULT_SPEC, "name=broken", "n_trials=4", "trainer.max_epochs=2", "log_models=none", "model.fault=raise",
            "max_failures=2", _notify(f"{{url: '{receiver.url}/hook', events: [study_started, study_finished, study_error]}}")]
    out = run_cli("--store", str(store), "study", "run", *args, cwd=FAULT_PROJECT, env=_env(), check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert receiver.events("/hook") == ["study_started", "study_error"]
    error = receiver.payloads()[-1]
    assert "2 trials failed in a row (max_failures=2)" in error["error"] and error["trials"]["fail"] == 2
    assert error["text"].startswith("hpolab: study broken stopped on an error on ")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["down", "fail", "block"])
def test_a_receiver_that_is_down_failing_or_slow_does_not_hold_the_study(store, tmp_path, mode):
    """The study ends (its parent run FINISHED, every trial told) while the receiver is still down, still
    failing or still blocking its first request; what was not delivered is counted in `study status`."""
    receiver = Receiver("block" if mode == "block" else "fail")
    url = receiver.url if mode != "down" else f"http://127.0.0.1:{free_port()}"
    try:
        args = [*ARGS, f"name=held-{mode}", "n_trials=2", _notify(f"{{url: '{url}/hook', timeout: 30, retries: 5}}")]
        out = run_cli("--store", str(store), "study", "run", *args, cwd=FAULT_PROJECT, env=_env(HPOLAB_NOTIFY_EXIT_WAIT="2"))
        client, study = open_study(store, f"held-{mode}")
        parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
        assert parent.info.status == "FINISHED" and [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]
        if mode == "block":
            assert receiver.entered == 1 and receiver.requests == []  # the study ended while its first request still hung
        elif mode == "fail":
            assert receiver.entered >= 2  # retried, answered 500 each time
        assert "not delivered" in out.stdout and "dropped" in out.stdout
        status = run_cli("--store", str(store), "study", "status", f"held-{mode}", cwd=tmp_path).stdout
        assert "notifications dropped: " in status, status
        dropped = int(status.split("notifications dropped: ")[1].split(" ")[0])
        assert dropped >= 1 and (mode != "block" or dropped == 4)  # (blocked: all four study events undelivered)
    finally:
        receiver.close()


@pytest.mark.slow
def test_two_workers_send_each_study_event_once(store, receiver, tmp_path):
    args = [FAULT_SPEC, "name=pair", "n_trials=4", "trainer.max_epochs=2", "model.sleep=0.02", "log_models=none", "sampler={type: random}",
            _notify(f"{{url: '{receiver.url}/hook', secret_env: HOOK_SECRET}}")]
    workers = [start_cli("--store", str(store), "worker", *args, cwd=FAULT_PROJECT, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outs
    events = receiver.events("/hook")
    assert events.count("study_started") == 1 and events.count("study_finished") == 1, events
    assert events[0] == "study_started" and events[-1] == "study_finished"
    bests = [p["trial"] for p in receiver.payloads() if p["event"] == "new_best"]
    assert len(bests) == len(set(bests)) >= 1  # each trial's own event, from the worker that ran it
    assert all(valid_signature(r, SECRET) for r in receiver.requests)


@pytest.mark.slow
def test_a_worker_killed_mid_trial_is_reported_lost_by_the_one_that_reaps_it(store, receiver):
    args = [FAULT_SPEC, "name=lost", "n_trials=2", "trainer.max_epochs=30", "model.sleep=0.02", "log_models=none",
            _notify(f"{{url: '{receiver.url}/hook', events: [worker_lost, trial_failed]}}")]
    driver = start_cli("--store", str(store), "study", "run", *args, cwd=FAULT_PROJECT, env=_env(), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    wait_for_checkpoints(store, 1, study="lost")
    driver.kill()  # SIGKILL: its trial stays RUNNING with a dead owner
    driver.wait()
    run_cli("--store", str(store), "study", "run", *args, cwd=FAULT_PROJECT, env=_env())  # the same command again: it reaps
    lost = [p for p in receiver.payloads() if p["event"] == "worker_lost"]
    _, study = open_study(store, "lost")
    assert len(lost) == 1 and lost[0]["trial"] == 0 and lost[0]["run_id"] == study.trials[0].user_attrs["mlflow_run_id"]
    assert "its driver" in lost[0]["reason"] and "retried as trial" in lost[0]["reason"], lost[0]
    assert [p["trial"] for p in receiver.payloads() if p["event"] == "trial_failed"] == []  # (reaped, not failed here)


@pytest.mark.slow
def test_promote_sends_champion_changed(store, receiver, tmp_path):
    args = ["studies/digits_cnn.yaml", "name=champ", "n_trials=1", "trainer.max_epochs=2", "log_models=complete",
            _notify(f"{{url: '{receiver.url}/hook', events: [champion_changed]}}")]
    run_cli("--store", str(store), "study", "run", *args, env=_env())
    run_cli("--store", str(store), "promote", "champ", env=_env())
    sent = receiver.payloads()
    assert [p["event"] for p in sent] == ["champion_changed"]
    assert (sent[0]["model"], sent[0]["alias"], sent[0]["version"], sent[0]["previous_version"], sent[0]["trial"]) == ("champ", "champion", 1, None, 0)
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    assert client.get_model_version_by_alias("champ", "champion").run_id == sent[0]["run_id"]
    run_cli("--store", str(store), "promote", "champ", env=_env())  # already the champion: nothing sent
    assert len(receiver.payloads()) == 1
