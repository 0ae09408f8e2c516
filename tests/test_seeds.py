"""Worker seeds differ across hosts and containers; a single driver stays reproducible; a user's own
sampler seed is combined with the salt, not replaced by it."""

from __future__ import annotations

import optuna
import pytest

from hpolab.config.samplers import make_sampler, sampler_seed
from hpolab.config.spec import load_spec
from hpolab.stores.optuna_storage import make_storage
from hpolab.stores.paths import resolve_stores
from hpolab.study.driver.driver import Driver
from hpolab.study.sampling.search_space import optuna_distributions
from hpolab.study.sampling.seeds import worker_salt

DEFAULT = "studies/digits_cnn.yaml"


def _first_config(spec, seed_offset: int) -> dict:
    study = optuna.create_study(sampler=make_sampler(spec, seed_offset=seed_offset))
    return study.ask(optuna_distributions(spec, lr_bounds=(1e-4, 1e-1))).params


def test_salt_differs_for_the_same_pid_on_other_hosts_or_with_other_random_bits():
    a = worker_salt(host="node-a", pid=1, start_ns=10**18, random_bits=b"\0" * 16)
    b = worker_salt(host="node-b", pid=1, start_ns=10**18, random_bits=b"\0" * 16)
    c = worker_salt(host="node-a", pid=1, start_ns=10**18, random_bits=b"\1" * 16)
    assert len({a, b, c}) == 3
    assert all(0 < s < 2**31 for s in (a, b, c))
    assert worker_salt() != worker_salt()  # two containers started in the same instant: random bits differ


def _driver(spec, tmp_path, salt: int) -> Driver:
    stores = resolve_stores(str(tmp_path / "mlruns"))
    (tmp_path / "mlruns").mkdir(exist_ok=True)
    driver = Driver(spec, stores, worker_seed=salt)
    driver.storage = make_storage(stores.optuna_url)
    optuna.create_study(storage=driver.storage, study_name=spec.name, load_if_exists=True)
    return driver


@pytest.mark.parametrize("own_seed", [[], ["sampler={type: tpe, kwargs: {seed: 7}}"]])
def test_two_workers_with_the_same_pid_propose_different_first_configurations(tmp_path, own_seed):
    spec = load_spec(DEFAULT, own_seed)
    salts = [worker_salt(host=h, pid=1, start_ns=10**18, random_bits=bytes(16)) for h in ("node-a", "node-b")]
    configs = [_first_config(spec, _driver(spec, tmp_path, s)._seed_offset()) for s in salts]
    assert configs[0] != configs[1]


def test_a_single_driver_is_reproducible_for_a_given_seed(tmp_path):
    spec = load_spec(DEFAULT, ["seed=11"])
    offsets = [_driver(spec, tmp_path, 0)._seed_offset() for _ in range(2)]
    assert offsets == [0, 0]
    assert _first_config(spec, offsets[0]) == _first_config(spec, offsets[1])
    assert sampler_seed(spec, offsets[0]) == 11


def test_own_sampler_seed_is_combined_with_the_offset_not_replacing_it():
    spec = load_spec(DEFAULT, ["sampler={type: random, kwargs: {seed: 7}}"])
    assert sampler_seed(spec, 0) == 7  # alone on a fresh study: exactly the user's seed
    assert sampler_seed(spec, 5) == 12
    assert _first_config(spec, 0) == _first_config(spec, 0)
    assert _first_config(spec, 0) != _first_config(spec, 123456)  # a second worker (or a re-run) draws anew
    assert sampler_seed(spec, 2**32 + 3) == 10  # kept in numpy's range
    unseeded = load_spec(DEFAULT, ["sampler={type: random, kwargs: {seed: null}}"])
    assert sampler_seed(unseeded, 5) is None
