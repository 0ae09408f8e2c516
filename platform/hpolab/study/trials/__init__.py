"""One trial, one process: the forkserver trials fork from and its preloads, the trial process (and its
DDP ranks), the runner that starts them on their GPUs with a lifeline, the child's model export, and
the driver's MLflow side of a trial (tracker, background uploads). May import study.state,
study.objectives and study.retention, never study.sampling, study.lr_test or study.driver."""
