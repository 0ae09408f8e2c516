"""The python parts of bench/gpu.sh: the CUDA paths of the training routine, and checks of a study's stores.

    PYTHONPATH=platform .venv/bin/python bench/gpu.py fit [--dry-run-cpu]
        hpolab.train.fit on synthetic 3x32x32 images with a small ResNet-style CNN, once per variant:
        fp32, bf16, fp16 + GradScaler, bf16 + channels_last, bf16 + torch.compile, bf16 through a
        DataLoader (pinned memory, non-blocking copies, 2 workers). Prints samples/s (training samples
        per second of training time, epochs 2.. only: epoch 1 pays cuDNN autotuning / compilation),
        the last val_acc, peak GPU memory and whether every loss was finite.
    PYTHONPATH=platform .venv/bin/python bench/gpu.py check-study STORE --trials N [--smi FILE] [--expect-amp bf16]
        Reads a study's stores (optuna.db, mlflow.db in STORE): every trial COMPLETE, finite, on CUDA,
        with the expected AMP mode; mean samples/s; with --smi, which GPUs the trial processes used
        and how many ran at once on each (from `nvidia-smi --query-compute-apps` samples).

Exit status 0 when everything ran and was finite, 1 otherwise (each problem is printed).
--dry-run-cpu runs `fit` on the CPU with tiny sizes (the CUDA-only variants are skipped) so that
this script can be checked on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Variants of the trainer config: name -> (TrainConfig overrides, through a DataLoader?, CUDA only?)
VARIANTS = {
    "fp32": ({"amp": "off"}, False, False),
    "bf16": ({"amp": "bf16"}, False, False),
    "fp16+GradScaler": ({"amp": "fp16"}, False, True),
    "bf16+channels_last": ({"amp": "bf16", "channels_last": True}, False, False),
    "bf16+compile": ({"amp": "bf16", "compile": True}, False, True),  # CPU inductor needs a C++ toolchain: GPU only
    "bf16+DataLoader(pinned)": ({"amp": "bf16", "num_workers": 2}, True, False),
}


# ------------------------------------------------------------------ fit on synthetic data


def synthetic_splits(n_train: int, n_val: int, size: int, through_loader: bool):
    """10 classes of 3 x size x size images: a fixed random prototype per class + noise (learnable
    in a few epochs, so val_acc says whether training works). through_loader wraps the splits in a
    plain Dataset, which sends fit() down its DataLoader path (pin_memory on CUDA, non_blocking)."""
    import torch
    from torch.utils.data import Dataset, TensorDataset

    from hpolab.train import DataSplits

    g = torch.Generator().manual_seed(0)
    prototypes = torch.randn(10, 3, size, size, generator=g)

    def split(n: int):
        y = torch.randint(0, 10, (n,), generator=g)
        x = prototypes[y] + 1.5 * torch.randn(n, 3, size, size, generator=g)
        return TensorDataset(x, y)

    class Plain(Dataset):  # not a TensorDataset: fit() uses a DataLoader for it
        def __init__(self, ds):
            self.ds = ds

        def __len__(self):
            return len(self.ds)

        def __getitem__(self, i):
            return self.ds[i]

    train, val = split(n_train), split(n_val)
    if through_loader:
        train, val = Plain(train), Plain(val)
    return DataSplits(train=train, val=val, test=val, num_classes=10, input_shape=(3, size, size))


def resnetish(width: int):
    """conv-bn-relu stem + 3 residual stages (width, 2x, 4x; stride 2 between): ~1.2 M params at width 64."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c_in, c_out, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out),
            )
            self.skip = nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.body(x) + self.skip(x))

    w = width
    return nn.Sequential(
        nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
        Block(w, w, 1), Block(w, 2 * w, 2), Block(2 * w, 4 * w, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, 10),
    )


def run_fit(name: str, overrides: dict, through_loader: bool, dry: bool) -> dict:
    import torch

    from hpolab.train import TrainConfig, fit, seed_everything

    # Sizes: on a GPU, enough work per epoch for samples/s to mean something (~16k images of 32x32);
    # on the CPU dry run, just enough to exercise the code.
    n_train, n_val, size, width, batch, epochs = (256, 128, 16, 8, 64, 2) if dry else (16384, 2048, 32, 64, 256, 3)
    cfg = TrainConfig(max_epochs=epochs, batch_size=batch, lr=2e-3, optimizer="adamw", scheduler="cosine",
                      device="cpu" if dry else "cuda", **overrides)
    seed_everything(0)
    data = synthetic_splits(n_train, n_val, size, through_loader)
    model = resnetish(width)
    if not dry:
        torch.cuda.reset_peak_memory_stats()
    history: list[dict] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as ckpt:  # checkpoints on: their save path runs too (compiled modules too)
        result = fit(cfg, model, data, metric="val_acc", direction="maximize", seed=0, checkpoint_dir=ckpt,
                     on_epoch=lambda e, m: history.append(m) and False)
    seconds = time.perf_counter() - t0
    later = history[1:] or history  # epoch 1 pays cuDNN autotuning, torch.compile, worker start-up
    losses = [m[k] for m in history for k in ("train_loss", "val_loss")]
    return {
        "variant": name,
        "amp": result.amp,
        "samples_per_s": statistics.median(m["samples_per_second"] for m in later),
        "epoch1_s": history[0]["epoch_seconds"],
        "data_wait": statistics.median(m["data_wait_fraction"] for m in later),
        "val_acc": history[-1]["val_acc"],
        "finite": all(math.isfinite(v) for v in losses),
        "peak_mib": 0.0 if dry else torch.cuda.max_memory_allocated() / 2**20,
        "seconds": seconds,
    }


def cmd_fit(args) -> int:
    import torch

    if not args.dry_run_cpu and not torch.cuda.is_available():
        print("gpu.py fit: torch.cuda.is_available() is False; use --dry-run-cpu to check this script on a CPU")
        return 1
    where = "CPU (dry run, tiny sizes)" if args.dry_run_cpu else torch.cuda.get_device_name(0)
    print(f"fit variants on {where}, torch {torch.__version__}")
    rows, problems = [], []
    for name, (overrides, through_loader, cuda_only) in VARIANTS.items():
        if args.dry_run_cpu and cuda_only:
            print(f"  {name:24} skipped on the CPU dry run")
            continue
        try:
            row = run_fit(name, overrides, through_loader, args.dry_run_cpu)
        except Exception as e:  # one broken path must not hide the others
            problems.append(f"{name}: {type(e).__name__}: {e}")
            print(f"  {name:24} FAILED: {type(e).__name__}: {e}")
            continue
        rows.append(row)
        if not row["finite"]:
            problems.append(f"{name}: a non-finite loss")
        print(f"  {name:24} {row['samples_per_s']:10.0f} samples/s  (epoch 1 {row['epoch1_s']:.2f} s, "
              f"data wait {row['data_wait']:.0%}, peak {row['peak_mib']:.0f} MiB) val_acc {row['val_acc']:.3f} "
              f"finite={row['finite']} amp={row['amp']}  {row['seconds']:.1f} s in all")
    by = {r["variant"]: r for r in rows}
    print("\n| variant | samples/s | vs fp32 | val_acc | finite | peak MiB |\n| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        speedup = f"{r['samples_per_s'] / by['fp32']['samples_per_s']:.2f}x" if "fp32" in by else "-"
        print(f"| {r['variant']} | {r['samples_per_s']:.0f} | {speedup} | {r['val_acc']:.3f} | {r['finite']} | {r['peak_mib']:.0f} |")
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


# ------------------------------------------------------------------ a study's stores


def smi_summary(path: Path) -> tuple[dict[str, int], set[str]]:
    """From `T <time>` lines followed by `gpu_uuid, pid` lines: per GPU, the most trial processes
    seen at once; and the set of pids seen."""
    most: dict[str, int] = {}
    pids: set[str] = set()
    sample: dict[str, set[str]] = {}

    def close():
        for gpu, ps in sample.items():
            most[gpu] = max(most.get(gpu, 0), len(ps))

    for line in path.read_text().splitlines():
        if line.startswith("T "):
            close()
            sample = {}
        elif "," in line:
            gpu, pid = (s.strip() for s in line.split(",")[:2])
            sample.setdefault(gpu, set()).add(pid)
            pids.add(pid)
    close()
    return most, pids


def cmd_check_study(args) -> int:
    import optuna
    from mlflow import MlflowClient

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = Path(args.store)
    if not (store / "optuna.db").is_file():
        print(f"PROBLEM: no study store at {store} (the study did not start; see its output above)")
        return 1
    study = optuna.load_study(study_name=args.study, storage=f"sqlite:///{store / 'optuna.db'}")
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    problems = []
    rates = []
    for t in study.trials:
        run = client.get_run(t.user_attrs["mlflow_run_id"]) if t.user_attrs.get("mlflow_run_id") else None
        tags = run.data.tags if run else {}
        sps = [m.value for m in client.get_metric_history(run.info.run_id, "samples_per_second")] if run else []
        rates += sps[1:] or sps
        print(f"  trial {t.number}: {t.state.name:8} value {t.value} device={tags.get('hpolab.device')} amp={tags.get('hpolab.amp')} "
              f"samples/s {statistics.median(sps) if sps else float('nan'):.0f}  {tags.get('hpolab.fail_reason', '')}")
        if t.state.name != "COMPLETE":
            problems.append(f"trial {t.number} is {t.state.name}: {tags.get('hpolab.fail_reason', '')}")
        elif not math.isfinite(t.value):
            problems.append(f"trial {t.number}: non-finite value {t.value}")
        if args.expect_device and tags.get("hpolab.device", "").split(":")[0] != args.expect_device:
            problems.append(f"trial {t.number} ran on {tags.get('hpolab.device')}, expected {args.expect_device}")
        if args.expect_amp and tags.get("hpolab.amp") != args.expect_amp:
            problems.append(f"trial {t.number} ran amp={tags.get('hpolab.amp')}, expected {args.expect_amp}")
        if run and not tags.get("hpolab.model_uri"):
            problems.append(f"trial {t.number}: no logged model ({tags.get('hpolab.model_error', 'no error recorded')})")
    finished = sum(t.state.name == "COMPLETE" for t in study.trials)
    if finished != args.trials:
        problems.append(f"{finished} COMPLETE trials, expected {args.trials}")
    print(f"  study {args.study}: {finished}/{args.trials} COMPLETE; median samples/s per trial epoch "
          f"{statistics.median(rates) if rates else float('nan'):.0f}")
    if args.smi:
        most, pids = smi_summary(Path(args.smi))
        print(f"  GPU processes seen: {len(pids)} pids; most at once per GPU: {most or 'none seen (trials too short for the 0.5 s sampling?)'}")
        if args.expect_most is not None and most and max(most.values()) > args.expect_most:
            problems.append(f"up to {max(most.values())} trial processes at once on one GPU, expected <= {args.expect_most}")
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit", help="the trainer's CUDA paths on synthetic data, samples/s per variant")
    f.add_argument("--dry-run-cpu", action="store_true", help="tiny sizes on the CPU; CUDA-only variants skipped")
    c = sub.add_parser("check-study", help="a finished study's trials: COMPLETE, finite, device, amp, samples/s")
    c.add_argument("store")
    c.add_argument("--study", default="digits-cnn")
    c.add_argument("--trials", type=int, required=True, help="COMPLETE trials expected")
    c.add_argument("--expect-device", default="cuda", help="hpolab.device tag of every trial (cuda, cpu)")
    c.add_argument("--expect-amp", help="hpolab.amp tag of every trial (bf16, fp16, off)")
    c.add_argument("--smi", help="nvidia-smi sampling file written by gpu.sh")
    c.add_argument("--expect-most", type=int, help="at most this many trial processes at once on one GPU")
    args = ap.parse_args()
    return cmd_fit(args) if args.command == "fit" else cmd_check_study(args)


if __name__ == "__main__":
    sys.exit(main())
