"""Other frameworks' training loops, reporting to an hpolab trial.

An experiment that brings its own loop defines `train(config, trial)`; these modules adapt the
callbacks of two popular trainers to that `trial` object, so a LightningModule or a Hugging Face
`Trainer` gets pruning, checkpoints, retries and MLflow from the platform:

    from hpolab.integrations.lightning import HpolabCallback, resume_path          # pip install hpolab[lightning]
    from hpolab.integrations.transformers import HpolabCallback, resume_folder     # pip install hpolab[transformers]

They see only the trial passed in (its report/checkpoint/restore/dir members): no Optuna, no MLflow, no
stores. Importing this package imports neither framework; each module needs its extra.
"""
