"""Where things live: store paths and URLs, the Optuna storage, MLflow runs and logged models, and
the environment record every run carries."""
