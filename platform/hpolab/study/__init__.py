"""The study driver: Optuna ask/tell, trial processes, heartbeats, retries."""
