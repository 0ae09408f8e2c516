"""hpolab: hyperparameter experiment platform for PyTorch (Optuna studies, isolated trials, MLflow).

Import-light on purpose: importing `hpolab` does no work and pulls in neither torch nor the
tracking stack; each subpackage imports what it needs.
"""

__version__ = "0.2.0"
