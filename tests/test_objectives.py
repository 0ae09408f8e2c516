"""Several objectives, constraints, the pruning metric: the spec, the ranking, the --pick rule, the
cost metrics -- without a study run (test_pareto_study.py runs one through the CLI)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from optuna.distributions import FloatDistribution
from optuna.study import StudyDirection
from optuna.trial import TrialState, create_trial

from conftest import run_cli
from hpolab.config.spec import load_spec
from hpolab.errors import SpecError, UserError
from hpolab.registry.pick import parse_rule, pick_from_front
from hpolab.study.objectives import ranking
from hpolab.study.objectives.objective_values import VALUES_ATTR
from hpolab.study.driver.spec_guard import defining_spec
from hpolab.train.costs import cost_metrics

PARETO = "studies/digits_pareto.yaml"
TWO = "objectives=[{metric: val_acc, direction: maximize}, {metric: latency_ms, direction: minimize}]"


def test_the_shipped_pareto_spec_fills_the_primary_metric_from_its_pruning_metric():
    spec = load_spec(PARETO)
    assert spec.is_multi_objective and [o.metric for o in spec.objective_list] == ["val_acc", "latency_ms"]
    assert (spec.metric, spec.direction) == ("val_acc", "maximize")  # what the routine picks its best epoch by
    import experiments.digits_cnn as exp

    cfg = spec.resolved_config(exp)
    assert cfg["objectives"] == ["val_acc", "latency_ms"] and cfg["cost_metrics"] == ["params", "latency_ms"]


def test_a_one_metric_spec_is_as_it_was():
    spec = load_spec("studies/digits_cnn.yaml")
    assert spec.objectives is None and not spec.is_multi_objective
    assert [(o.metric, o.direction) for o in spec.objective_list] == [("val_acc", "maximize")]
    import experiments.digits_cnn as exp

    assert "objectives" not in spec.resolved_config(exp)
    defining = defining_spec(spec)  # the recorded definition (and its hash) of existing studies is unchanged
    assert not {"objectives", "pruning", "constraints"} & set(defining)


@pytest.mark.parametrize("override, expected", [
    (["objectives=[{metric: val_acc, direction: maximize}, {metric: latency, direction: minimize}]"],
     "objectives.1.metric: 'latency' is not a metric of this task nor a cost metric"),
    (["objectives=[{metric: val_acc, direction: minimize}, {metric: params, direction: minimize}]"],
     "objectives.0.direction: val_acc should be maximized"),
    (["objectives=[{metric: val_acc, direction: up}, {metric: params, direction: minimize}]"], "objectives.0.direction"),
    (["pruning={metric: latency_ms}"], "pruning.metric: latency_ms is measured once after training"),
    (["pruning={metric: val_loss}"], "pruning.metric: 'val_loss' is not an objective"),
    (["objectives=[{metric: params, direction: minimize}, {metric: latency_ms, direction: minimize}]", "pruning=null"],
     "objectives: at least one must be an epoch metric"),
    (["metric=val_acc"], "objectives: give objectives: or metric:/direction:, not both"),
    (["constraints=[{metric: params}]"], "constraints.0: constraint on params: give exactly one of max or min"),
    (["constraints=[{metric: flops, max: 3}]"], "constraints.0.metric: 'flops' is not a metric"),
    (["sampler={type: cmaes}"], "sampler.type: cmaes optimises one objective"),
    (["stop_after_no_improvement={trials: 5, min_delta: 0.01}"], "stop_after_no_improvement.min_delta: with several objectives"),
])
def test_bad_objectives_are_refused_naming_the_field(override, expected):
    with pytest.raises(SpecError) as e:
        load_spec(PARETO, override)
    assert expected in str(e.value)


def test_pruning_without_objectives_is_refused():
    with pytest.raises(SpecError, match="pruning: names one of several objectives"):
        load_spec("studies/digits_cnn.yaml", ["pruning={metric: val_acc}"])


def test_cli_refuses_bad_objectives_in_one_line(store):
    out = run_cli("--store", str(store), "study", "run", PARETO, "pruning={metric: latency_ms}", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "pruning.metric" in out.stderr + out.stdout


def _trial(number, values, constraints=None, state=TrialState.COMPLETE, recorded=None):
    t = create_trial(state=state, values=values if state == TrialState.COMPLETE else None, params={"x": 0.5},
                     distributions={"x": FloatDistribution(0, 1)},
                     system_attrs={"constraints": constraints} if constraints is not None else None,
                     user_attrs={VALUES_ATTR: recorded} if recorded else None)
    t.number = number
    return t


def test_ranking_one_objective_by_value_infeasible_last():
    trials = [_trial(0, [0.9]), _trial(1, [0.95], constraints=[1.0]), _trial(2, [0.8]), _trial(3, None, state=TrialState.PRUNED)]
    assert ranking.top_k(trials, 3, "maximize") == [0, 2, 1]
    assert ranking.best(trials, "maximize").number == 0  # 1 is better but infeasible
    assert ranking.top_k(trials, 2, ["minimize"]) == [2, 0]


def test_ranking_several_objectives_by_pareto_rank_and_the_knee():
    # maximize acc, minimize ms: 0, 1, 2 are on the front; 3 is dominated by 1; 4 is infeasible
    trials = [_trial(0, [0.99, 5.0]), _trial(1, [0.95, 1.0]), _trial(2, [0.80, 0.5]), _trial(3, [0.90, 2.0]),
              _trial(4, [1.0, 0.1], constraints=[3.0])]
    dirs = [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE]
    assert [t.number for t in ranking.front(trials, dirs)] == [0, 1, 2]
    assert ranking.top_k(trials, 5, ["maximize", "minimize"]) == [0, 1, 2, 3, 4]
    assert ranking.pareto_ranks(ranking.losses(trials[:4], dirs)).tolist() == [0, 0, 0, 1]
    assert ranking.knee(ranking.front(trials, dirs), dirs).number == 1  # near the ideal (0.99, 0.5) once scaled
    assert ranking.knee(list(reversed(ranking.front(trials, dirs)[:2])), dirs).number == 0  # a tie: the better first objective
    hv = ranking.hypervolume_history(trials, dirs)
    assert [n for n, _ in hv] == [0, 1, 2, 3] and all(b >= a for (_, a), (_, b) in zip(hv, hv[1:])) and hv[1][1] > hv[0][1]


def test_pick_rules_choose_from_the_front_and_say_why():
    trials = [_trial(0, [0.99, 5.0], recorded={"params": 900.0}), _trial(1, [0.95, 1.0], recorded={"params": 500.0}),
              _trial(2, [0.80, 0.5], recorded={"params": 100.0}), _trial(3, [0.90, 2.0])]
    study = SimpleNamespace(study_name="s", directions=[StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE],
                            get_trials=lambda deepcopy=False: trials)
    names = ["val_acc", "latency_ms"]
    assert pick_from_front(study, names, "val_acc>=0.9; min latency_ms")[0].number == 1
    assert pick_from_front(study, names, "max val_acc")[0].number == 0
    assert pick_from_front(study, names, "params<200")[0].number == 2
    t, why = pick_from_front(study, names, None)
    assert t.number == 1 and "knee" in why and "(0, 1, 2)" in why
    with pytest.raises(UserError, match=r"no trial on the Pareto front meets it. The front: trial 0: val_acc=0.99"):
        pick_from_front(study, names, "val_acc>=0.999")
    for bad, msg in (("val_acc=>3", "cannot read"), ("accuracy>1", "not an objective"), ("min val_acc; max latency_ms", "one 'min'/'max'")):
        with pytest.raises(UserError, match=msg):
            parse_rule(bad, ["latency_ms", "val_acc"])


def test_cost_metrics_of_a_model():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    out = cost_metrics(["params", "model_mb", "latency_ms"], model, torch.zeros(2, 4), torch.device("cpu"))
    assert out["params"] == 4 * 3 + 3 + 3 + 3  # weights, bias, BN weight and bias (its running stats are buffers)
    assert out["model_mb"] == pytest.approx((18 + 3 + 3 + 1) * 4 / 2**20, rel=0.5)  # + buffers (num_batches_tracked is int64)
    assert 0 < out["latency_ms"] < 1000 and model.training  # measured in eval mode, put back as it was
    assert set(cost_metrics(["params"], model, torch.zeros(1, 4), torch.device("cpu"))) == {"params"}


def test_companion_trials_of_a_dead_driver_end_like_their_real_trial(tmp_path):
    """A driver killed mid-trial leaves its companion pruning trial RUNNING; the next driver's
    close_orphans ends it as its (reaped) real trial ended, and leaves live ones alone."""
    import optuna

    from hpolab.study.objectives.pruning import Pruning

    spec = load_spec(PARETO)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.create_study(storage=storage, study_name=spec.name, directions=["maximize", "minimize"])
    dead = Pruning(spec, storage)  # the driver that dies: three trials, their companions RUNNING
    real = []
    for _ in range(3):
        t = study.ask()
        r = SimpleNamespace(number=t.number, trial=t)
        dead.report(r, 0.5, 1)
        real.append(t)
    storage.set_trial_state_values(real[0]._trial_id, state=TrialState.FAIL)  # reaped
    real[1].set_user_attr(VALUES_ATTR, {"val_acc": 0.93, "latency_ms": 0.2})
    study.tell(real[1], [0.93, 0.2])  # finished, but the companion's tell was lost
    # real[2] still runs on another (live) worker

    assert Pruning(spec, storage).close_orphans(study) == 2
    companion = optuna.load_study(study_name=spec.name + "~pruning", storage=storage)
    by_real = {c.user_attrs["hpolab.trial"]: c for c in companion.get_trials()}
    assert by_real[0].state == TrialState.FAIL
    assert by_real[1].state == TrialState.COMPLETE and by_real[1].value == 0.93
    assert by_real[2].state == TrialState.RUNNING
    assert Pruning(spec, storage).close_orphans(study) == 0


def test_the_gate_of_several_objectives_checks_every_one():
    from hpolab.registry import gate_objectives as go
    from hpolab.registry.gate import Contest

    dirs = {"val_acc": "maximize", "latency_ms": "minimize", "params": "minimize"}
    names = list(dirs)
    test = {"acc": 0.95, "loss": 0.2}
    mine = go.gate_values(names, test, {"val_acc": 0.99, "latency_ms": 0.3, "params": 900.0})
    assert mine == {"val_acc": 0.95, "latency_ms": 0.3, "params": 900.0}  # val_acc: the test split's acc
    tags = {"hpolab.objective.latency_ms": "0.5", "hpolab.objective.params": "900.0"}
    c = Contest("m", "champion", 3, "s", champion_version="1")

    def decide(holder_test, bounds=(), force=False, holder_tags=tags):
        return go.decide(mine, go.holder_values(names, holder_test, holder_tags), dirs, bounds, force, c)

    d = decide({"acc": 0.97})  # faster, less accurate: the stated rule's trade-off
    assert d.promote and "on latency_ms, worse on val_acc" in d.reason and "test_acc 0.95 vs 0.97" in d.reason
    d = decide({"acc": 0.95}, holder_tags={**tags, "hpolab.objective.latency_ms": "0.3"})  # equal on every one
    assert not d.promote and d.exit_code == 3 and "better than m@champion (version 1) on no objective" in d.reason
    d = decide({"acc": 0.96}, holder_tags={**tags, "hpolab.objective.latency_ms": "0.2"})  # dominated
    assert not d.promote and "on no objective" in d.reason
    assert decide({"acc": 0.96}, holder_tags={**tags, "hpolab.objective.latency_ms": "0.2"}, force=True).promote
    d = decide({"acc": 0.90}, bounds=(("val_acc", ">=", 0.97),))  # held on validation (0.99), not on test
    assert not d.promote and "val_acc>=0.97 (test_acc 0.95)" in d.reason
    d = decide({"acc": 0.90}, holder_tags={})  # a holder from a one-objective study: its test acc only
    assert d.promote and "not compared: latency_ms, params" in d.reason
    assert not decide(None).promote  # not comparable (another test split)
    assert go.decide(mine, None, dirs, (), False, Contest("m", "champion", 3, "s")).promote  # nobody holds it
    assert go.gate_values(["val_iou", "params"], test, {"val_iou": 0.8, "params": 5.0}) == {"params": 5.0}  # no test iou: not compared
    d = go.decide(mine, None, dirs, (("val_f1", ">=", 0.9),), False, Contest("m", "champion", 3, "s"), {"val_f1": 0.85})
    assert not d.promote and "val_f1>=0.9 (test_f1 0.85)" in d.reason  # a bound on a constrained, not objective, metric


def test_several_objectives_stop_when_trials_no_longer_join_the_front():
    from hpolab.study.objectives.stopping import front_streak

    dirs = ["maximize", "minimize"]
    trials = [_trial(0, [0.90, 1.0]), _trial(1, [0.95, 2.0]),  # both on the front
              _trial(2, [0.90, 1.0]),  # equal to trial 0: brings nothing
              _trial(3, [0.80, 3.0]),  # dominated
              _trial(4, [0.99, 9.0], constraints=[1.0]),  # infeasible
              _trial(5, None, state=TrialState.PRUNED)]
    streak, on_front = front_streak(trials, dirs)
    assert streak == 4 and [t.number for t in on_front] == [0, 1]
    streak, on_front = front_streak(trials + [_trial(6, [0.92, 0.5])], dirs)  # dominates trial 0: joins
    assert streak == 0 and [t.number for t in on_front] == [1, 6]
    assert front_streak(trials, dirs, start=4)[0] == 2  # the ones before a raised budget shape the front only
    assert load_spec(PARETO, ["stop_after_no_improvement=6"]).stop_after_no_improvement.trials == 6


def test_a_feasible_trial_dominated_only_by_an_infeasible_one_is_ranked_on_the_front():
    # minimize both: X (infeasible) dominates F; H dominates G. The feasible front is F and H.
    x, f, h, g = (_trial(0, [5.0, 0.0], constraints=[1.0]), _trial(1, [6.0, 1.0], constraints=[0.0]),
                  _trial(2, [0.0, 10.0], constraints=[0.0]), _trial(3, [1.0, 11.0], constraints=[0.0]))
    dirs = ["minimize", "minimize"]
    assert [t.number for t in ranking.front([x, f, h, g], dirs)] == [1, 2]
    assert ranking.top_k([x, f, h, g], 2, dirs) == [2, 1]  # the front (ties: the better first objective)
    assert ranking.top_k([x, f, h, g], 4, dirs) == [2, 1, 3, 0]  # then the dominated, then the infeasible
    assert ranking.top_k([g, h, f, x], 1, dirs) == [2]  # `enough` counts feasible trials only


def test_one_objective_with_constraints_ranks_infeasible_trials_by_violation():
    trials = [_trial(0, [0.1], constraints=[2.0]), _trial(1, [0.2], constraints=[1.0]),
              _trial(2, [0.5], constraints=[0.0]), _trial(3, [0.3], constraints=[-1.0])]
    assert ranking.top_k(trials, 4, "minimize") == [3, 2, 1, 0]  # feasible by value, then the smaller violation
    assert ranking.best(trials, "minimize").number == 3
    assert ranking.best(trials[:2], "minimize") is None  # no feasible trial: no best


def test_the_knee_of_a_front_with_an_infinite_value_does_not_warn():
    import math
    import warnings

    trials = [_trial(0, [math.inf, 1.0]), _trial(1, [1.0, 2.0]), _trial(2, [2.0, 0.5]), _trial(3, [0.5, math.inf])]
    dirs = ["maximize", "minimize"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        on_front = ranking.front(trials, dirs)
        assert [t.number for t in on_front] == [0, 2]
        assert ranking.knee(on_front, dirs).number == 0  # an infinite accuracy at the cost of 0.5 ms more
        assert ranking.front_marks(trials, dirs) == {0: "knee", 2: "yes"}
        assert ranking.knee([trials[1], trials[3]], dirs).number == 1  # an infinite latency is the worst
