"""A paused trial (RUNNING in Optuna, no process) is shown PAUSED, not RUNNING, by `study status`,
`compare` and `Study.trials_df()`: a user reading the table sees it is neither training nor finished."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from conftest import run_cli
from hpolab.stores.trial_states import shown


def _study_with_a_paused_trial(store, name: str, resumed: bool = True) -> None:
    """Trial 0 COMPLETE, 1 paused at rung 0, and (`resumed`) 2 resumed: RUNNING and training."""
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{store / 'optuna.db'}", direction="maximize")
    dist = {"lr": FloatDistribution(0.01, 1.0)}
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.9, params={"lr": 0.1}, distributions=dist,
                                 intermediate_values={1: 0.5, 2: 0.9}))
    study.add_trial(create_trial(state=TrialState.RUNNING, params={"lr": 0.2}, distributions=dist,
                                 intermediate_values={1: 0.4}, system_attrs={"hpolab.paused": {"rung": 0, "epoch": 1}}))
    if resumed:
        study.add_trial(create_trial(state=TrialState.RUNNING, params={"lr": 0.3}, distributions=dist,
                                     intermediate_values={1: 0.3}, system_attrs={"hpolab.paused": None}))


def test_a_paused_trial_is_shown_paused_by_status_and_compare(store):
    _study_with_a_paused_trial(store, "shown")
    status = run_cli("--store", str(store), "study", "status", "shown").stdout
    states = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in status.splitlines() if line.count("│") > 3}
    assert states == {"0": "COMPLETE", "1": "PAUSED", "2": "RUNNING"}, status
    csv = run_cli("--store", str(store), "compare", "shown", "--format", "csv").stdout.splitlines()
    assert sorted(line.split(",")[:2] for line in csv[1:]) == [["0", "COMPLETE"], ["1", "PAUSED"], ["2", "RUNNING"]], csv


def test_shown_state():
    def t(state, attrs):
        return SimpleNamespace(number=0, state=state, system_attrs=attrs)

    assert shown(t("RUNNING", {"hpolab.paused": {"rung": 1, "epoch": 3}})) == "PAUSED"
    assert shown(t(TrialState.RUNNING, {"hpolab.paused": None})) == "RUNNING"
    assert shown(t(TrialState.PRUNED, {"hpolab.paused": {"rung": 1, "epoch": 3}})) == "PRUNED"  # ended at its rung


def test_the_report_of_a_study_with_only_paused_trials_says_it_is_stopped(store):
    _study_with_a_paused_trial(store, "stopped", resumed=False)
    run_cli("--store", str(store), "report", "stopped")
    html = (store / "reports" / "stopped.html").read_text()
    status = html.split('status</div><div class="v">', 1)[1].split("</div>", 1)[0]
    assert not status.startswith("running"), status  # nothing trains: a re-run resumes the paused trial
    assert "This study was still running" not in html
