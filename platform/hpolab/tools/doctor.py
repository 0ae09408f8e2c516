"""`hpolab doctor SPEC`: cheap sanity checks before a costly study (the design's practices, "Troubleshooting built in").

1. data: the splits load, a sample has the declared input_shape, the targets fit the experiment's task
   (classification: labels in [0, num_classes); regression: float (N,) or (N, k); multilabel: 0/1
   (N, k)), inputs are finite, and (classification) how the classes are balanced;
2. model: every trainable weight is registered (the "python list of layers" bug), and a batch
   gives (N, num_classes) finite outputs;
3. "can it overfit a tiny batch?": the shared training routine, with the spec's trainer settings and
   the task's loss, trains on 32 training samples and evaluates on the same 32; a working
   model/loss/optimizer reaches ~100% accuracy there (classification), or cuts its training loss by
   90% (every other task). If it can't, the full study won't learn either (bad LR, broken labels,
   a frozen or disconnected layer, a loss that does not match the outputs).

Nothing is written to the stores. Exit 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

TINY = 32  # samples in the overfit batch
OVERFIT_EPOCHS = 150  # full passes over the tiny batch (one optimizer step each)
OVERFIT_TARGET = 0.99  # accuracy on the tiny batch that counts as "it can overfit" (classification)
OVERFIT_LOSS_DROP = 0.9  # other tasks: the training loss must fall by this fraction of its first epoch


def _check(results: list[tuple[str, bool, str]], name: str, ok: bool, detail: str) -> bool:
    results.append((name, ok, detail))
    return ok


def run_doctor(spec, threads: int | None = None) -> tuple[list[tuple[str, bool, str]], dict[str, Any]]:
    """Data checks, model checks, then "can it overfit a tiny batch?" with the spec's trainer."""
    import torch

    from hpolab.config.experiment import load_experiment
    from hpolab.train.data import data_seed_of
    from hpolab.train.tasks import task_for

    if threads:
        torch.set_num_threads(threads)
    exp = load_experiment(spec.experiment)
    cfg = spec.resolved_config(exp)
    results: list[tuple[str, bool, str]] = []
    facts: dict[str, Any] = {}
    task = task_for(exp)
    data = exp.load_data(cfg["data"], data_seed_of(cfg))
    probe, targets_ok = _check_data(results, facts, data, task)
    _check_model(results, exp.build_model(cfg["model"], data.input_shape, data.num_classes), probe, data)
    if targets_ok:  # training on targets the task cannot read would only repeat that finding
        _check_overfit(results, facts, spec, exp, cfg, data, task)
    if spec.trainer.batch_size > 0:
        eff = spec.trainer.batch_size * spec.trainer.grad_accum_steps
        facts["lr_rule_of_thumb"] = (
            f"effective batch {eff}: if you change it, scale lr by sqrt(new/old) "
            f"(e.g. x{math.sqrt(2):.2f} for twice the batch)"
        )
    return results, facts


def _check_data(results, facts, data, task):
    """Splits, input shape, targets, class balance, finite inputs; returns (a probe batch of inputs, targets ok)."""
    import torch

    from hpolab.train.tasks import sample_targets

    sizes = {k: len(getattr(data, k)) for k in ("train", "val", "test")}
    _check(results, "data: splits load", min(sizes.values()) > 0, ", ".join(f"{k} {v}" for k, v in sizes.items()))
    x0, y0 = data.train[0]
    x0 = torch.as_tensor(x0)
    _check(results, "data: input shape", tuple(x0.shape) == tuple(data.input_shape),
           f"sample {tuple(x0.shape)}, declared {tuple(data.input_shape)}")
    targets = torch.as_tensor(sample_targets(data.train))
    try:
        task.check_targets(targets, data.num_classes)
        targets_ok, detail = True, f"{tuple(targets.shape)} {targets.dtype}, {data.num_classes} output(s)"
    except ValueError as e:
        targets_ok, detail = False, str(e)
    _check(results, f"data: targets fit task {task.name}", targets_ok, detail)
    if targets_ok and task.name == "classification":
        _check_class_balance(results, facts, targets.long(), data.num_classes)
    probe = torch.stack([torch.as_tensor(data.train[i][0]) for i in range(min(TINY, sizes["train"]))]).float()
    _check(results, "data: inputs finite", bool(torch.isfinite(probe).all()), f"mean {probe.mean():.3g}, std {probe.std():.3g}")
    return probe, targets_ok


def _check_class_balance(results, facts, labels, num_classes: int) -> None:
    import torch

    counts = torch.bincount(labels, minlength=num_classes)
    _check(results, "data: labels in range", True, f"{num_classes} classes; train labels {int(labels.min())}..{int(labels.max())}")
    ratio = float(counts.max() / counts.clamp(min=1).min())
    facts["class_imbalance"] = ratio
    _check(results, "data: class balance", True,
           f"largest/smallest class = {ratio:.1f}" + (" (consider trainer.class_weighting or balanced_sampler)" if ratio > 3 else ""))


def _check_model(results, model, probe, data) -> None:
    """Every parameter registered (the "list of layers" bug); output shape and finiteness."""
    import torch

    from hpolab.train.optim import find_unregistered_parameters

    unregistered = find_unregistered_parameters(model)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    _check(results, "model: parameters registered", not unregistered and n_params > 0,
           f"{n_params:,} trainable" + (f"; NOT registered: {', '.join(unregistered)} (use nn.ModuleList / nn.Parameter)" if unregistered else ""))
    model.eval()
    with torch.no_grad():
        out = model(probe[:2])
    _check(results, "model: output shape", tuple(out.shape) == (2, data.num_classes) and bool(torch.isfinite(out).all()),
           f"outputs {tuple(out.shape)} for a batch of 2, expected (2, {data.num_classes}) (num_classes = model outputs)")


def _check_overfit(results, facts, spec, exp, cfg, data, task) -> None:
    """Overfit a tiny batch with the spec's trainer (its optimizer, lr, AMP, clipping ...)."""
    from torch.utils.data import Subset, TensorDataset

    from hpolab.train import fit, seed_everything
    from hpolab.train.data import DataSplits, is_in_memory

    idx = list(range(min(TINY, len(data.train))))
    if is_in_memory(data.train):
        xs, ys = data.train.tensors
        tiny = TensorDataset(xs[idx], ys[idx])
    else:
        tiny = Subset(data.train, idx)
    tiny_splits = DataSplits(train=tiny, val=tiny, test=tiny, num_classes=data.num_classes, input_shape=data.input_shape)
    tcfg = dataclasses.replace(
        spec.trainer, max_epochs=OVERFIT_EPOCHS, batch_size=len(idx), grad_accum_steps=1, scheduler="none",
        warmup_epochs=0.0, early_stopping_patience=None, num_workers=0, balanced_sampler=False,
        inject_nan_at_step=None, inject_oom_at_step=None,
    )
    seed_everything(spec.seed)  # a seeded initialization: the same check gives the same answer
    fresh = exp.build_model(cfg["model"], data.input_shape, data.num_classes)
    classify = task.name == "classification"
    metric, direction = ("val_acc", "maximize") if classify else ("val_loss", "minimize")
    try:
        result = fit(tcfg, fresh, tiny_splits, metric=metric, direction=direction, seed=spec.seed, task=task)
        first, last = result.history[0]["train_loss"], result.history[-1]["train_loss"]
        best = result.best_value
        facts.update({"overfit_loss_first": first, "overfit_loss_last": last})
        if classify:
            facts["overfit_acc"] = best
            ok, reached = best >= OVERFIT_TARGET, f"accuracy {best:.3f}, "
        else:
            ok, reached = last <= (1 - OVERFIT_LOSS_DROP) * first, f"training loss down {1 - last / first:.1%} (needs {OVERFIT_LOSS_DROP:.0%}), "
        hint = "" if ok else (
            f" -- it cannot fit {len(idx)} samples: try another trainer.lr (now {spec.trainer.lr:g}; `hpolab lr-find` helps), "
            "check that labels match inputs, and that no layer is frozen or disconnected"
        )
        _check(results, "training: overfits a tiny batch", ok,
               f"{len(idx)} samples, {OVERFIT_EPOCHS} steps at lr {spec.trainer.lr:g}: {reached}"
               f"loss {first:.3g} -> {last:.3g}{hint}")
    except Exception as e:  # NaN, a shape error in the loss ... is the finding
        _check(results, "training: overfits a tiny batch", False, f"{type(e).__name__}: {e}")


def doctor_cmd(args, stores) -> int:
    from rich.console import Console

    from hpolab.config.spec import load_spec

    from hpolab.config.experiment import load_experiment
    from hpolab.config.training_loop import require_builtin_loop

    spec = load_spec(args.spec, list(getattr(args, "overrides", None) or []))
    require_builtin_loop(load_experiment(spec.experiment), "doctor")
    console = Console(highlight=False)
    console.print(f"[bold]hpolab doctor[/] {args.spec} (experiment {spec.experiment})")
    results, facts = run_doctor(spec)
    for name, ok, detail in results:
        mark = "[green]ok  [/]" if ok else "[red]FAIL[/]"
        console.print(f"  {mark} {name}: {detail}")
    if "lr_rule_of_thumb" in facts:
        console.print(f"  note: {facts['lr_rule_of_thumb']}")
    failed = [n for n, ok, _ in results if not ok]
    console.print("all checks passed" if not failed else f"[red]{len(failed)} check(s) failed[/]")
    return 0 if not failed else 1
