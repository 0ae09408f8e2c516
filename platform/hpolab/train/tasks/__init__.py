"""Tasks: what a model's outputs and the targets mean -- the loss, the validation metrics, what serving
returns, and which targets are valid. An experiment declares its task (`TASK = "regression"`; default
"classification"), or brings its own loss and metrics (`TASK = "custom"`).

A task is a small object with the same methods whatever the task (no inheritance):

    metric_directions(cfg)        {"val_rmse": "minimize", ...}: the val_* metrics a study may select on
    check_config(cfg)             problems with trainer options that do not apply to this task
    check_targets(targets, k)     one clear ValueError naming the task and what it expected
    bind(cfg, data, device)       a BoundTask: the same task with what it learns from the train split
                                  (class weights, target mean/std)

A BoundTask does the work:

    criterion(outputs, targets)   the training loss (a mean over the batch; what the optimizer minimizes)
    val_loss_sum(outputs, targets) summed validation loss of a batch (float64)
    keep(outputs)                 what evaluation keeps of a batch for the split's metrics
    split_metrics(kept, targets)  metrics over the whole split (outputs concatenated), no "val_" prefix
    head()                        an nn.Module turning model outputs into served predictions, or None
    evaluate_served(served, y)    {"loss", <metrics>, "n"} from served predictions (promote's test metrics)

Classification is exactly the routine's behaviour before tasks existed (bit for bit): the training
criterion is cross-entropy / label smoothing / focal / class weights; val_loss is plain cross-entropy.

One module per task (classification.py, regression.py, multilabel.py, custom.py); common.py holds
what they share, experiment.py picks an experiment's task. The names below are the package's API.
"""

from .classification import BoundClassification, Classification
from .common import CLASSIFICATION_ONLY, MULTILABEL_ONLY, REGRESSION_ONLY, RUN_METRICS, TASKS
from .custom import BoundCustom, Custom
from .experiment import metric_problems, sample_targets, task_for
from .multilabel import BoundMultilabel, Multilabel, multilabel_stats
from .regression import REGRESSION_LOSSES, BoundRegression, Regression, Standardized, regression_stats

__all__ = [
    "CLASSIFICATION_ONLY",
    "MULTILABEL_ONLY",
    "REGRESSION_LOSSES",
    "REGRESSION_ONLY",
    "RUN_METRICS",
    "TASKS",
    "BoundClassification",
    "BoundCustom",
    "BoundMultilabel",
    "BoundRegression",
    "Classification",
    "Custom",
    "Multilabel",
    "Regression",
    "Standardized",
    "metric_problems",
    "multilabel_stats",
    "regression_stats",
    "sample_targets",
    "task_for",
]
