"""The test suite's order and its fast tier: which modules run first (the longest, so that two
workers end together), and the check that `scripts/test --fast` (-m "not slow") still runs a test of
every module not listed as end-to-end only. conftest.py imports the hooks (pytest finds them there).
"""

from __future__ import annotations

from pathlib import Path

import pytest

# ---- the inner loop (`scripts/test --fast` = -m "not slow") must still touch every test module

_DESELECTED: set[str] = set()
# Modules that are one end-to-end scenario and nothing else: the fast suite skips them whole, and
# names them here with what they run; every other test module keeps at least one fast test.
END_TO_END_ONLY = {
    "test_asha_resume_records.py": "an ASHA study whose trial resumes at every rung, against an uninterrupted one",
    "test_trial_reads.py": "a driver's study, counting its reads of the trials per start",
    "test_budget.py": "four workers racing for one study's budget",
    "test_chaos.py": "random SIGKILLs of a running study",
    "test_pareto_study.py": "a study of two objectives through the CLI (test_objectives.py is its fast side)",
    "test_distributed.py": "PostgreSQL + a real mlflow server + four workers",
    "test_docs_images.py": "the docs' screenshots made from a study through the MLflow UI in Chromium",
    "test_fashion_e2e.py": "a study, promote and predict on image files",
    "test_launch_slurm.py": "sbatch arrays and scancel on the local Slurm",
    "test_mlflow_auth.py": "a study against a real basic-auth mlflow server",
    "test_proxy_heartbeat.py": "a worker SIGKILLed on another host, reaped through the gRPC proxy",
    "test_lr_step_faults.py": "signals and two workers during a study's LR range test",
    "test_pyfunc_serving.py": "the champion per task type through pyfunc in an empty folder and mlflow models serve",
    "test_failures.py": "crashes, OOMs, kills and timeouts of real trials and drivers",
    "test_own_loop_faults.py": "an own training loop's driver SIGKILLed and resumed; two workers on its study",
    "test_driver_fds.py": "a driver running twelve trials in the test process",
    "test_faults.py": "signals and kills of real drivers",
    "test_study_check.py": "study check on copies of a study the real CLI built",
    "test_storage_outage.py": "PostgreSQL restarted under a running study",
    "test_study_e2e.py": "the default study through the CLI",
    "test_ui_browser.py": "the MLflow UI in Chromium",
    "test_uploads.py": "a worker SIGKILLed and another resuming from the artifact store",
    "test_scheduled_recovery.py": "study check and its repair after an ASHA driver was SIGKILLed mid-segment",
    "test_nan_under_schedulers.py": "ASHA and PBT studies whose metric is NaN, through the CLI",
    "test_one_path.py": "ASHA, PBT and a SIGKILLed driver's retry, for a routine and an own-loop experiment",
    "test_one_path_results.py": "one study per experiment kind: its best epoch, logged model, promote, reproduce",
    "test_promote_kinds.py": "promote on a two-objective study of each experiment kind, and from a logged model without best.pt",
    "test_stores_followed.py": "a script's study, promote and predict in a store elsewhere, read back from another folder",
}


# The modules that take longest (tens of seconds each, measured with --durations), run first: the two
# xdist workers then end on short modules, not one waiting for the other's long one (longest first is
# how a fixed set of jobs is best shared). scripts/test passes --no-loadscope-reorder so that xdist
# keeps this order instead of sending the modules with the most tests first. A stale entry costs time only.
LONGEST_FIRST = ["test_kill_points.py", "test_pyfunc_serving.py", "test_asha_study.py", "test_launch_slurm.py", "test_pbt_study.py", "test_killed_driver_metric_backfill.py", "test_distributed.py", "test_failures.py",
                 "test_ui_browser.py", "test_storage_outage.py", "test_faults.py", "test_child_export.py",
                 "test_code_travels.py", "test_compose.py", "test_lr_step_faults.py", "test_trial_state.py",
                 "test_retention.py", "test_promote.py", "test_chaos.py", "test_store_errors.py",
                 "test_pareto_study.py", "test_proxy_heartbeat.py", "test_study_controls.py",
                 "test_trial_forkserver.py", "test_budget.py", "test_tasks.py", "test_study_commands.py",
                 "test_notify.py", "test_study_steer.py", "test_system_metrics.py",
                 "test_claimed_trials.py", "test_nan_under_schedulers.py", "test_scheduler_spec_changes.py",
                 "test_one_path.py", "test_one_path_results.py"]


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def pytest_deselected(items):
    _DESELECTED.update(str(item.path) for item in items)


def pytest_collection_finish(session):
    config = session.config
    whole_suite = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.getoption("keyword")
    if config.getoption("markexpr") != "not slow" or not whole_suite:
        return
    selected = {str(item.path) for item in session.items}
    uncovered = sorted(set(Path(p).name for p in _DESELECTED - selected) - set(END_TO_END_ONLY))
    if uncovered:
        raise pytest.UsageError(f"the fast suite runs no test of {', '.join(uncovered)}: leave its cheapest test unmarked")
