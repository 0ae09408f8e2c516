"""hpolab: hyperparameter experiment platform for PyTorch (Optuna studies, isolated trials, MLflow).

Import-light on purpose: importing `hpolab` does no work and pulls in neither torch nor the
tracking stack (nor Optuna or pandas); each subpackage imports what it needs. The Python API
(hpolab.api) is reached from here lazily, on first use of one of its names:

    hpolab.run_study(spec, overrides)   run or continue a study (as `hpolab study run`) -> Study
    hpolab.load_study(name_or_spec)     a study in its stores -> Study
    hpolab.Study                        .trials_df() .best .front() .check() .report() .promote()
    hpolab.lr_find(spec, overrides)     the LR range test (as `hpolab lr-find`)
    hpolab.predict(model_uri, inputs)   predictions of a promoted model as a DataFrame (as `hpolab predict`)
"""

__version__ = "0.4.1"

# name -> the hpolab.api module defining it
_API = {"run_study": "running", "load_study": "study", "Study": "study", "BestTrial": "study", "Promotion": "study",
        "lr_find": "models", "LRFind": "models", "predict": "models"}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    """The API's names, imported on first use (PEP 562): `import hpolab` itself stays light."""
    if name not in _API:
        raise AttributeError(f"module 'hpolab' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"hpolab.api.{_API[name]}"), name)
    globals()[name] = value  # (the next access is a plain lookup)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
