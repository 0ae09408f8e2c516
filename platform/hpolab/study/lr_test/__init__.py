"""The LR range test: the step a study runs once before its first trial, which worker claims it, and
the test itself (shared with `hpolab lr-find`). May import study.state and study.trials, never
study.driver."""
