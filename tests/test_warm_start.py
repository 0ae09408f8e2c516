"""Warm start's choice of configurations, on a real SQLite store and no training: the same
configuration finishing twice in the earlier study (NSGA-II's crossover can copy a parent; a retry
re-runs one) is enqueued once, and the next best configuration takes the other slot."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from hpolab.config.spec import load_spec
from hpolab.study.sampling import warm_start

DISTS = {"trainer.lr": FloatDistribution(3e-4, 3e-2, log=True), "model.channels": CategoricalDistribution([4, 8, 16, 32]),
         "model.depth": IntDistribution(1, 3), "model.dropout": FloatDistribution(0.0, 0.4)}


def _trial(lr: float, acc: float, latency: float) -> optuna.trial.FrozenTrial:
    params = {"trainer.lr": lr, "model.channels": 8, "model.depth": 2, "model.dropout": 0.1}
    return create_trial(state=TrialState.COMPLETE, values=[acc, latency], params=params, distributions=DISTS,
                        system_attrs={"constraints": [-1.0]})


def test_a_configuration_that_finished_twice_is_enqueued_once(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    source = optuna.create_study(study_name="earlier", storage=storage, directions=["maximize", "minimize"])
    for lr, acc, latency in ((1e-3, 0.99, 1.0), (1e-3, 0.99, 1.0), (2e-3, 0.98, 1.0), (5e-3, 0.5, 2.0)):
        source.add_trial(_trial(lr, acc, latency))
    spec = load_spec("studies/digits_pareto.yaml", ["name=later", "warm_start={from: earlier, top_k: 2}"])
    study = optuna.create_study(study_name="later", storage=storage, directions=["maximize", "minimize"])
    summary = warm_start.apply(study, storage, spec, warm_start.check_source(storage, spec), None)
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [t.user_attrs["hpolab.warm_start_from"] for t in waiting] == ["earlier trial 0", "earlier trial 2"]
    assert [t.system_attrs["fixed_params"]["trainer.lr"] for t in waiting] == [1e-3, 2e-3]
    assert "2 best configurations enqueued (trials 0, 2)" in summary
    assert warm_start.apply(study, storage, spec, source, None) is None  # once per study


# ---- through the real CLI: a tiny study with a constraint (params: 1,210 with 16 hidden units, 2,410 with 32)

WARM_BASE = ["n_trials=2", "parallel=1", "trainer.max_epochs=1", "log_models=none", "sampler={type: grid}"]
BOUND = "constraints=[{metric: params, max: 2000}]"


def _warm_store(store):
    from conftest import FAULT_PROJECT, FAULT_SPEC, run_cli

    run_cli("--store", str(store), "study", "run", FAULT_SPEC, *WARM_BASE, BOUND, cwd=FAULT_PROJECT)
    return f"sqlite:///{store / 'optuna.db'}"


@pytest.mark.slow
def test_imported_trials_keep_their_named_constraints(store):
    """The driver records each constraint under its own name (`trial.set_constraint`: system attr
    `constraints:<name>`); the samplers read them back as `trial.constraints`. An imported infeasible
    trial must stay infeasible in the new study, or the sampler steers towards it."""
    from conftest import FAULT_PROJECT, FAULT_SPEC, run_cli
    from optuna.study._constrained_optimization import _get_feasible_trials

    storage = _warm_store(store)
    source = optuna.load_study(study_name="faulty", storage=storage)
    assert sorted(t.params["model.hidden"] for t in source.get_trials()) == [16, 32]
    out = run_cli("--store", str(store), "study", "run", FAULT_SPEC, "name=faulty-warm", "n_trials=1", "parallel=1",
                  "trainer.max_epochs=1", "log_models=none", "sampler={type: random}", BOUND,
                  "warm_start={from: faulty, top_k: 0, import_trials: true}", cwd=FAULT_PROJECT)
    assert "2 finished trials imported" in out.stdout, out.stdout
    warm = optuna.load_study(study_name="faulty-warm", storage=storage)
    imported = {t.system_attrs["hpolab.imported_from"]: t for t in warm.get_trials() if t.system_attrs.get("hpolab.imported_from")}
    assert len(imported) == 2
    for t in source.get_trials():
        copy = imported[f"faulty trial {t.number}"]
        assert copy.constraints == t.constraints == {"params <= 2000": pytest.approx(t.user_attrs["hpolab.objectives"]["params"] - 2000)}
    # what every Optuna sampler reads: the 32-unit trial is infeasible here too
    feasible = {t.params["model.hidden"] for t in _get_feasible_trials(list(imported.values()))}
    assert feasible == {16}


@pytest.mark.slow
def test_a_warm_start_across_different_constraints_is_refused(store):
    from conftest import FAULT_PROJECT, FAULT_SPEC, run_cli

    storage = _warm_store(store)
    for other in ("constraints=[{metric: params, max: 3000}]", "constraints=[]"):
        bad = run_cli("--store", str(store), "study", "run", FAULT_SPEC, "name=faulty-warm", "n_trials=1", "log_models=none",
                      "sampler={type: random}", other, "warm_start={from: faulty, top_k: 0, import_trials: true}",
                      cwd=FAULT_PROJECT, check=False)
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and len(lines) == 1 and "Traceback" not in bad.stderr, bad.stderr
        assert "'faulty'" in lines[0] and "'faulty-warm'" in lines[0] and "params <= 2000" in lines[0], lines[0]
        assert "faulty-warm" not in [s.study_name for s in optuna.get_all_study_summaries(storage)]


def test_the_end_table_labels_imported_trials_and_ranks_them_nowhere():
    """`study run`'s end table: a warm start's imported trial (COMPLETE, no epochs here) is labelled as
    such, listed after this study's ranked trials, and set aside in the counts line, as `study status`
    says it; the best is this study's own."""
    import io

    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial
    from rich.console import Console

    from hpolab.config.spec import load_spec
    from hpolab.stores.trial_counts import count_trials
    from hpolab.study.driver.progress import Progress

    spec = load_spec("studies/digits_cnn.yaml", ["n_trials=2"])
    dist = {"trainer.lr": FloatDistribution(1e-4, 1e-1, log=True)}
    study = optuna.create_study(direction="maximize")
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.999, params={"trainer.lr": 0.01}, distributions=dist,
                                 system_attrs={"hpolab.imported_from": "digits-cnn trial 7"}))
    for value in (0.95, 0.97):
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=value, params={"trainer.lr": 0.001}, distributions=dist,
                                     intermediate_values={0: value - 0.1, 1: value}))
    out = io.StringIO()
    counts = count_trials(study.get_trials())
    Progress(spec, console=Console(file=out, width=200, highlight=False)).end(study, counts, spec)
    rows = [line for line in out.getvalue().splitlines() if line.startswith("│")]
    cells = [[c.strip() for c in row.strip("│").split("│")] for row in rows]
    assert [c[:2] for c in cells] == [["2", "COMPLETE"], ["1", "COMPLETE"], ["0", "COMPLETE (imported)"]], out.getvalue()
    assert "2 complete (1 imported by a warm start: not counted)" in out.getvalue()
