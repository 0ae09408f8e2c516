"""A finished trial's objective values, and which trials are best: ranking for one objective and for
several (the Pareto front, the rank tags of logged models, the front table), pruning, stopping a
study that stopped improving. May import study.state only."""
