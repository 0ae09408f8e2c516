"""Worker jobs for cluster schedulers: Slurm sbatch arrays and Kubernetes Indexed Jobs.

A launcher renders what a scheduler runs -- N copies of `hpolab worker SPEC [key=value ...]` against
shared stores -- and (for Slurm) submits it. It knows the worker's command line and the stores' URLs,
never the driver's internals: the workers themselves share the budget, reap each other's dead trials
and resume interrupted ones, exactly as workers started by hand do.
"""
