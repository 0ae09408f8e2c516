#!/usr/bin/env bash
# GPU check: the CUDA paths never run while hpolab was built (no GPU then), in one go, under 5 minutes.
#
#   bench/gpu.sh                 # on a CUDA machine, from anywhere; venv at .venv (or PYTHON=...)
#   bench/gpu.sh --dry-run-cpu   # the same steps on the CPU with tiny sizes (checks the script itself)
#
# Steps (each with its own time limit; a failed step is reported and the next one still runs):
#   1. fit variants (bench/gpu.py fit): fp32 vs bf16 vs fp16+GradScaler samples/s, channels_last,
#      torch.compile, DataLoader with pinned memory + non-blocking copies; finite losses.
#   2. a study with trials PACKED on the GPUs (parallel = 2 x GPUs), bf16 + channels_last.
#   3. a study with ONE trial PER GPU (parallel = GPUs, via CUDA_VISIBLE_DEVICES), fp16 + GradScaler.
#   4. a study whose trials use torch.compile inside the forked trial processes.
# Studies 2-4 go through the real CLI (`hpolab study run`) on the digits demo, each in a fresh store;
# their trials must all be COMPLETE, finite, on CUDA, with the asked AMP mode and a logged model.
# nvidia-smi is sampled every 0.5 s during the studies to show how many trial processes shared a GPU.
# Exit status: 0 all steps passed; 1 a step failed; 2 no CUDA (this is not a GPU machine).
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
HPOLAB=$(dirname "$PY")/hpolab  # the console script next to that python (PYTHONPATH below picks this checkout's code)
export PYTHONPATH="$ROOT/platform${PYTHONPATH:+:$PYTHONPATH}"
DRY=0
[[ "${1:-}" == "--dry-run-cpu" ]] && DRY=1

if [[ ! -x "$PY" || ! -x "$HPOLAB" ]]; then
    echo "gpu.sh: no $PY or $HPOLAB; create the venv (scripts/setup) or set PYTHON=/path/to/python" >&2
    exit 2
fi

# ---- 0. is there a GPU?
if [[ $DRY == 0 ]]; then
    if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
        echo "gpu.sh: torch.cuda.is_available() is False: no CUDA GPU visible here (or a CPU-only torch build)." >&2
        echo "        Run this on a machine with an NVIDIA GPU; to check the script itself on a CPU: bench/gpu.sh --dry-run-cpu" >&2
        exit 2
    fi
    NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
    nvidia-smi -L || true
    DEVICE=cuda; AMP_PACKED=bf16; AMP_PER_GPU=fp16; EPOCHS=4; SCALE=1
else
    echo "gpu.sh: DRY RUN on the CPU (tiny sizes, amp bf16/off, no compile study): checks the script, measures nothing"
    NGPU=1
    DEVICE=cpu; AMP_PACKED=bf16; AMP_PER_GPU=off; EPOCHS=2; SCALE=10  # a slow shared CPU: 10x the time limits
fi
"$PY" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPUs {torch.cuda.device_count()}")'
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>} (hpolab gives each trial its own GPU index through it)"

WORK=$(mktemp -d -t hpolab-gpu-XXXXXX)
FAILED=()
T0=$SECONDS

limited() {  # limited SECONDS CMD...: a time limit; SIGINT first (hpolab stops cleanly), SIGKILL 10 s later
    local limit=$(($1 * SCALE)); shift
    timeout --signal=INT --kill-after=10 "$limit" "$@"
    local rc=$?
    [[ $rc == 124 ]] && echo "   (stopped: over its ${limit} s limit)"
    return $rc
}

step() {  # step NAME CMD...: run one step, record a failure, never stop the script
    local name=$1; shift
    echo; echo "== $name"
    local t=$SECONDS
    if "$@"; then echo "-- $name: ok ($((SECONDS - t)) s)"; else
        echo "-- $name: FAILED ($((SECONDS - t)) s)"
        FAILED+=("$name")
    fi
}

smi_start() {  # sample which processes run on which GPU, every 0.5 s, into $1
    if [[ $DRY == 1 ]] || ! command -v nvidia-smi >/dev/null; then SMI_PID=; return; fi
    ( while :; do echo "T $(date +%s.%N)"; nvidia-smi --query-compute-apps=gpu_uuid,pid --format=csv,noheader 2>/dev/null; sleep 0.5; done ) >"$1" &
    SMI_PID=$!
}
smi_stop() { [[ -n "${SMI_PID:-}" ]] && kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null; SMI_PID=; }

study() {  # study NAME LIMIT_S TRIALS PARALLEL EXPECT_AMP EXPECT_MOST [key=value ...]: run + check one study
    local name=$1 limit=$2 trials=$3 parallel=$4 amp=$5 most=$6; shift 6
    local store="$WORK/$name"
    smi_start "$WORK/$name.smi"
    limited "$limit" "$HPOLAB" --store "$store" study run studies/digits_cnn.yaml n_trials="$trials" parallel="$parallel" \
        'sampler={type: random}' 'pruner={type: none}' trainer.early_stopping_patience=null \
        trainer.max_epochs="$EPOCHS" trainer.device="$DEVICE" "$@"
    local rc=$?
    smi_stop
    local smi=(); [[ -s "$WORK/$name.smi" ]] && smi=(--smi "$WORK/$name.smi" --expect-most "$most")
    "$PY" bench/gpu.py check-study "$store" --trials "$trials" --expect-device "$DEVICE" --expect-amp "$amp" "${smi[@]}" || rc=1
    return $rc
}

# (AMP values are passed quoted, trainer.amp='"off"': overrides are typed like YAML, where a bare off is false.)

# ---- 1. the trainer's CUDA paths, in-process (hpolab.train.fit), samples/s per variant
FIT_ARGS=(); [[ $DRY == 1 ]] && FIT_ARGS=(--dry-run-cpu)
step "fit variants" limited 140 "$PY" bench/gpu.py fit "${FIT_ARGS[@]}"

# ---- 2. several trials per GPU (2 per GPU at once), bf16 + channels_last
step "study: trials packed 2 per GPU, $AMP_PACKED + channels_last" \
    study packed 50 $((2 * NGPU)) $((2 * NGPU)) "$AMP_PACKED" 2 trainer.amp="\"$AMP_PACKED\"" trainer.channels_last=true

# ---- 3. one trial per GPU (the driver sets CUDA_VISIBLE_DEVICES per trial), fp16 + GradScaler
step "study: one trial per GPU ($NGPU GPUs), $AMP_PER_GPU" \
    study per-gpu 40 "$NGPU" "$NGPU" "$AMP_PER_GPU" 1 trainer.amp="\"$AMP_PER_GPU\""

# ---- 4. torch.compile inside forked trial processes (inductor compiles once per trial process)
if [[ $DRY == 0 ]]; then
    step "study: torch.compile in trial processes" \
        study compile 70 2 2 bf16 2 trainer.amp=bf16 trainer.compile=true
fi

echo; echo "gpu.sh: $((SECONDS - T0)) s in all; stores in $WORK"
if [[ ${#FAILED[@]} -gt 0 ]]; then
    echo "gpu.sh: FAILED steps: ${FAILED[*]}"
    exit 1
fi
echo "gpu.sh: all steps passed"
