"""The driver: the ask/tell loop, what a trial's messages mean (events), terminal progress, the
parent run, the spec and code guards, signals, and the heartbeats of the running trials with the
reaper of dead ones (they act on the runner's running trials, so they sit above study.trials). The
top of study/: may import every other study sub-package; none imports it."""
