"""The study: Optuna ask/tell around trials that each run in their own process, logged to MLflow.

Sub-packages, bottom first; each may import the ones listed before it, never those after it:
state, objectives, sampling, retention, trials, lr_test, driver (tests/test_layout.py checks this).
They may import hpolab.errors, train, config and stores, never registry, analysis, launch, tools or cli."""
