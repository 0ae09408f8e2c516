-- The MLflow tracking database next to Optuna's (the postgres image creates `optuna` itself).
CREATE DATABASE mlflow;
