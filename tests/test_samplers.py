"""Samplers and pruners by name from the spec, and the pruning logic on fabricated trials."""

from __future__ import annotations

import optuna
import pytest

from hpolab.config.spec import SpecError, load_spec
from hpolab.config.samplers import PRUNERS, SAMPLERS, make_pruner, make_sampler

DEFAULT = "studies/digits_cnn.yaml"


GRID_SPACE = ("search_space={model.channels: {type: categorical, choices: [8, 16, 32, 64]}, "
              "model.dropout: {type: categorical, choices: [0.0, 0.1, 0.2, 0.3]}}")


def _proposals(spec, n: int = 12, seed_offset: int = 0) -> list[dict]:
    """The first n configurations a study proposes with the sampler hpolab builds from `spec`
    (the spec's own search space; every trial told a value that depends on its parameters)."""
    from hpolab.study.sampling.search_space import optuna_distributions

    study = optuna.create_study(direction="maximize", sampler=make_sampler(spec, seed_offset=seed_offset))
    dists = optuna_distributions(spec, lr_bounds=(1e-4, 1e-1))
    out = []
    for _ in range(n):
        t = study.ask(dists)
        out.append(t.params)
        study.tell(t, sum(float(v) if isinstance(v, (int, float)) else 0.0 for v in t.params.values()))
    return out


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_every_sampler_builds_and_is_seeded(name):
    space = [GRID_SPACE] if name == "grid" else []
    spec = load_spec(DEFAULT, [f"sampler={{type: {name}}}", "seed=3", *space])
    assert isinstance(make_sampler(spec), SAMPLERS[name])
    first = _proposals(spec)
    assert _proposals(spec) == first  # the study seed decides every proposal
    other = load_spec(DEFAULT, [f"sampler={{type: {name}}}", "seed=4", *space])
    assert _proposals(other) != first  # ... and another seed proposes others


@pytest.mark.parametrize("name", sorted(PRUNERS))
def test_every_pruner_builds(name):
    kwargs = {"threshold": "{lower: 0.5}", "percentile": "{percentile: 25.0}", "patient": "{patience: 2, wrapped: {type: median}}"}.get(name, "{}")
    spec = load_spec(DEFAULT, [f"pruner={{type: {name}, kwargs: {kwargs}}}"])
    assert isinstance(make_pruner(spec), PRUNERS[name])


def test_bad_pruner_kwargs_are_spec_errors():
    with pytest.raises(SpecError, match="pruner.kwargs: median rejects them"):
        load_spec(DEFAULT, ["pruner={type: median, kwargs: {n_warmup_steps: -1}}"])
    with pytest.raises(SpecError, match="pruner.kwargs.wrapped"):
        load_spec(DEFAULT, ["pruner={type: patient, kwargs: {patience: 1, wrapped: {type: nope}}}"])


def test_same_seed_same_proposals_and_offset_differs():
    spec = load_spec(DEFAULT, ["sampler={type: random}"])
    dist = optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)

    def proposals(offset):
        study = optuna.create_study(sampler=make_sampler(spec, seed_offset=offset))
        return [study.ask({"lr": dist}).params["lr"] for _ in range(3)]

    assert proposals(0) == proposals(0)
    assert proposals(0) != proposals(5)  # a resumed study does not replay the same draws


def _study_with_history(pruner, curves):
    study = optuna.create_study(direction="maximize", pruner=pruner)
    for curve in curves:
        t = study.ask()
        for step, v in enumerate(curve, 1):
            t.report(v, step)
        study.tell(t, max(curve))
    return study


def test_median_pruner_from_spec_prunes_a_bad_curve_and_keeps_a_good_one():
    spec = load_spec(DEFAULT, ["pruner={type: median, kwargs: {n_startup_trials: 3, n_warmup_steps: 2}}"])
    study = _study_with_history(make_pruner(spec), [[0.5, 0.7, 0.8]] * 3)
    bad = study.ask()
    bad.report(0.2, 1)
    assert not bad.should_prune()  # still in warm-up at step 1
    bad.report(0.3, 2)
    assert bad.should_prune()
    good = study.ask()
    good.report(0.6, 1)
    good.report(0.9, 2)
    assert not good.should_prune()


def test_threshold_pruner_from_spec():
    spec = load_spec(DEFAULT, ["pruner={type: threshold, kwargs: {lower: 0.5}}"])
    study = optuna.create_study(direction="maximize", pruner=make_pruner(spec))
    t = study.ask()
    t.report(0.4, 1)
    assert t.should_prune()
