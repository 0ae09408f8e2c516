"""What the sampler draws from: the search space as Optuna distributions, the workers' seed salt,
the spec's enqueued configurations and warm start from an earlier study. May import study.state and
study.objectives only."""
