"""The Python API: the functions users call from scripts and notebooks, which the CLI is a layer over.

    import hpolab
    study = hpolab.run_study("studies/digits_cnn.yaml", {"n_trials": 4})
    study.trials_df(); study.best; study.promote(); hpolab.predict("models:/digits-cnn@champion", x)

Each module is one idea: specs.py (a spec from a path or a dict), stores.py (which stores, and the
environment left as found), running.py (run_study and the CLI's `study run`), study.py (load_study
and Study), models.py (lr_find, predict). Importing this package imports none of torch, MLflow,
Optuna or pandas: each function imports what it uses.
"""

from hpolab.api.models import LRFind, lr_find, predict
from hpolab.api.running import run_study
from hpolab.api.study import BestTrial, Promotion, Study, load_study

__all__ = ["BestTrial", "LRFind", "Promotion", "Study", "load_study", "lr_find", "predict", "run_study"]
