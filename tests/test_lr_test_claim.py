"""The study's LR range test runs once per study behind Optuna's gRPC storage proxy too.

Through the proxy no database lock can be taken (stores/budget_lock.py), so the workers elect the one
that runs the test with claim trials (study/lr_test/lr_claim.py): trial numbers are handed out in one total
order, so the lowest-numbered live claim wins, the others wait for its result (and take over when its
owner is gone). The end-to-end test starts three workers together through the real proxy; the logic
tests race claimers on threads through an in-process proxy.
"""

from __future__ import annotations

import subprocess
import threading
import time
import warnings

import optuna
import pytest
from optuna.trial import TrialState

from conftest import FAULT_PROJECT, FAULT_SPEC, hpolab_env, open_study, run_cli, start_cli, storage_proxy
from services import free_port

# The fault project's MLP, slowed (50 ms a forward call) so the 40-step LR range test takes a few
# seconds: workers started together all reach it before the first one records its result.
ARGS = ["n_trials=3", "parallel=1", "trainer.max_epochs=1", "model.sleep=0.05", "log_models=none",
        "lr_range_test={enabled: true, num_steps: 40, min_lr: 1.0e-5, max_lr: 10.0}",
        "search_space={trainer.lr: {type: float, log: true, from_lr_range_test: true}}"]


def _lr_runs(client) -> list:
    exp = client.get_experiment_by_name("faulty")
    return client.search_runs([exp.experiment_id], filter_string="attributes.run_name = 'lr-range-test'")


@pytest.mark.slow
def test_workers_started_together_through_the_proxy_run_the_lr_range_test_once(store, tmp_path):
    database = f"sqlite:///{store / 'optuna.db'}"
    with storage_proxy(database, tmp_path) as grpc:
        env = {**hpolab_env(), "OPTUNA_STORAGE": grpc, "HPOLAB_HEARTBEAT_INTERVAL": "1", "HPOLAB_GRACE_PERIOD": "20"}
        cmd = ["--store", str(store), "worker", FAULT_SPEC, *ARGS]
        workers = [start_cli(*cmd, cwd=FAULT_PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for _ in range(3)]
        outs = [w.communicate(timeout=400)[0] for w in workers]
        for w, out in zip(workers, outs):
            assert w.returncode == 0, out
        check = run_cli("--store", str(store), "--storage", grpc, "study", "check", "faulty", cwd=FAULT_PROJECT, check=False)
        assert check.returncode == 0, check.stdout + check.stderr

    ran = [out for out in outs if "running the LR range test" in out]
    assert len(ran) == 1, "\n\n".join(outs)  # exactly one worker ran the sweep
    assert sum("using the LR range test another worker ran" in out for out in outs) == 2, "\n\n".join(outs)
    client, study = open_study(store)
    (lr_run,) = _lr_runs(client)  # one MLflow run of the test
    attr = study.user_attrs["lr_range_test"]
    assert attr["mlflow_run_id"] == lr_run.info.run_id
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.data.params["lr_range_test.run_id"] == lr_run.info.run_id
    trials = [t for t in study.get_trials() if not t.system_attrs.get("hpolab.released")]
    assert len([t for t in trials if t.state == TrialState.COMPLETE]) == 3, [(t.number, t.state) for t in trials]
    for t in trials:
        assert attr["low"] <= t.params["trainer.lr"] <= attr["high"]


# ---------------------------------------------------------------- the claim on its own, through a real proxy


@pytest.fixture
def proxy_url(tmp_path):
    """An Optuna gRPC storage proxy (the server `hpolab storage-proxy` runs) in this process, on SQLite."""
    from hpolab.stores.grpc_proxy import make_proxy_server

    port = free_port()
    server = make_proxy_server(f"sqlite:///{tmp_path / 'optuna.db'}", "127.0.0.1", port)
    server.start()
    optuna.create_study(study_name="claims", storage=_client(port))
    yield port
    server.stop(0)


def _client(port: int):
    from optuna.storages import GrpcStorageProxy

    with warnings.catch_warnings():  # "GrpcStorageProxy is experimental"
        warnings.simplefilter("ignore")
        storage = GrpcStorageProxy(host="127.0.0.1", port=port)  # one per worker, as each worker process has its own
    storage.wait_server_ready(timeout=10)
    return storage


def _recorded(study) -> bool:
    return bool(study.user_attrs.get("lr_range_test"))


def test_of_workers_claiming_together_one_runs_the_test_and_the_others_use_its_result(proxy_url):
    from hpolab.study.lr_test.lr_claim import LRTestClaim

    ran, results, start = [], [], threading.Barrier(4)

    def worker(i: int) -> None:
        study = optuna.load_study(study_name="claims", storage=_client(proxy_url))
        start.wait()
        claim = LRTestClaim(study)
        claim.take()
        try:
            if claim.wait_for_turn(lambda: _recorded(study), timeout=30, aborting=lambda: False):
                ran.append(i)
                time.sleep(0.5)  # the test runs: the others must still be waiting, not running it too
                study.set_user_attr("lr_range_test", {"low": 0.001, "high": 0.1, "by": i})
        finally:
            claim.end("done")
        results.append(study.user_attrs["lr_range_test"]["by"])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(ran) == 1, ran
    assert results == ran * 4  # every worker reads the one result
    tickets = optuna.load_study(study_name="claims", storage=_client(proxy_url)).get_trials()
    assert len(tickets) == 4 and all(t.state == TrialState.FAIL and t.system_attrs["hpolab.released"] for t in tickets)


def test_a_holder_that_records_and_ends_between_a_waiters_two_looks_is_not_followed_by_a_second_test(proxy_url):
    """The waiter looks for a result, then at the tickets ahead. When the holder records its result and
    ends its ticket between those two looks, the waiter sees nothing live ahead; it must find the result
    then, not run the test a second time."""
    from hpolab.study.lr_test.lr_claim import LRTestClaim

    study = optuna.load_study(study_name="claims", storage=_client(proxy_url))
    holder, waiter = LRTestClaim(study), LRTestClaim(study)
    holder.take()
    waiter.take()
    looks = []

    def recorded() -> bool:
        looks.append(_recorded(study))
        if len(looks) == 1:  # right after the waiter's first look: the holder finishes its turn
            study.set_user_attr("lr_range_test", {"low": 0.001, "high": 0.1})
            holder.end("recorded")
        return looks[-1]

    assert waiter.wait_for_turn(recorded, timeout=30, aborting=lambda: False) is False
    assert looks == [False, True]


def test_a_claim_whose_holder_is_gone_is_taken_over(proxy_url):
    from hpolab.study.lr_test.lr_claim import CLAIM, LRTestClaim

    gone = subprocess.Popen(["true"])
    gone.wait()
    study = optuna.load_study(study_name="claims", storage=_client(proxy_url))
    first = LRTestClaim(study)
    first.take()
    # The first holder's process died on this host (its owner record now names a finished pid).
    record = {**study.trials[first.number].system_attrs[CLAIM], "pid": gone.pid}
    study._storage.create_new_trial(study._study_id)  # (unrelated trials between tickets do not matter)
    dead = optuna.create_trial(state=TrialState.FAIL, system_attrs={"hpolab.released": True, CLAIM: record})
    study._storage.create_new_trial(study._study_id, template_trial=dead)
    first.end("recorded")  # and the live one ahead of it ended: nothing live is ahead of the next ticket
    second = LRTestClaim(study)
    second.take()
    t0 = time.monotonic()
    assert second.wait_for_turn(lambda: _recorded(study), timeout=30, aborting=lambda: False)
    assert time.monotonic() - t0 < 5  # at once, not after a grace period


def test_waiting_for_a_live_claim_ends_with_a_clear_error(proxy_url, monkeypatch):
    from hpolab.errors import StudyError
    from hpolab.study.lr_test import lr_claim

    monkeypatch.setattr(lr_claim, "HEARTBEAT_INTERVAL", 0.2)
    study = optuna.load_study(study_name="claims", storage=_client(proxy_url))
    holder = lr_claim.LRTestClaim(optuna.load_study(study_name="claims", storage=_client(proxy_url)))
    holder.take()
    stop = threading.Event()
    beating = threading.Thread(target=lambda: [holder.beat() for _ in iter(lambda: stop.wait(0.1), True)])
    beating.start()
    try:
        waiter = lr_claim.LRTestClaim(study)
        waiter.take()
        with pytest.raises(StudyError, match=r"timed out after 2 s waiting for the LR range test .* \(claim trial 0\)"):
            waiter.wait_for_turn(lambda: _recorded(study), timeout=2, aborting=lambda: False)
    finally:
        stop.set()
        beating.join()


def test_a_silent_claim_of_another_host_is_taken_over_after_the_grace_period(proxy_url, monkeypatch):
    from hpolab.study.lr_test import lr_claim

    monkeypatch.setattr(lr_claim, "GRACE_PERIOD", 1.0)
    study = optuna.load_study(study_name="claims", storage=_client(proxy_url))
    elsewhere = {**lr_claim.owner_record(-1), "host": "elsewhere.example"}  # its pid cannot be checked here
    silent = optuna.create_trial(state=TrialState.FAIL, system_attrs={"hpolab.released": True, lr_claim.CLAIM: elsewhere})
    study._storage.create_new_trial(study._study_id, template_trial=silent)
    claim = lr_claim.LRTestClaim(study)
    claim.take()
    t0 = time.monotonic()
    assert claim.wait_for_turn(lambda: _recorded(study), timeout=30, aborting=lambda: False)
    assert 1.0 <= time.monotonic() - t0 < 10


def test_the_holder_stays_live_while_it_records_its_result_however_long_that_takes(proxy_url, monkeypatch):
    """The holder beats through its whole turn: the test's process and then its MLflow run and plot,
    which on a busy machine can outlast the grace period; a waiting worker must not take over then."""
    from hpolab.study.lr_test import lr_claim, lr_step

    monkeypatch.setattr(lr_claim, "HEARTBEAT_INTERVAL", 0.2)
    monkeypatch.setattr(lr_claim, "GRACE_PERIOD", 1.0)
    holder_study = optuna.load_study(study_name="claims", storage=_client(proxy_url))

    def slow_run_and_record(*args, **kwargs):  # a record phase 3 grace periods long, beating nowhere itself
        time.sleep(3.0)
        holder_study.set_user_attr("lr_range_test", {"low": 1e-3, "high": 1e-1})

    monkeypatch.setattr(lr_step, "_run_and_record", slow_run_and_record)
    holder = threading.Thread(target=lr_step._run_by_claim, args=(holder_study, lambda m: None, lambda: False, ()))
    holder.start()
    study = optuna.load_study(study_name="claims", storage=_client(proxy_url))
    deadline = time.monotonic() + 10
    while not [t for t in study.get_trials(deepcopy=False) if t.system_attrs.get(lr_claim.CLAIM)] and time.monotonic() < deadline:
        time.sleep(0.05)
    waiter = lr_claim.LRTestClaim(study)
    waiter.take()
    try:
        assert not waiter.wait_for_turn(lambda: _recorded(study), timeout=30, aborting=lambda: False)  # it used the holder's result
    finally:
        waiter.end("test")
        holder.join()
