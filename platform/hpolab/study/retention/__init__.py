"""Which finished trials keep a logged model and their checkpoints (spec `log_models`), and
`hpolab study prune-files`. May import study.state and study.objectives only."""
