"""Commands around a study: doctor, the install check (env), the MLflow UI, lr-find."""
