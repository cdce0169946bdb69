#!/usr/bin/env bash
# Issue 73's training-step profile on a lent GPU, as one command (bench/by_hand.md, "Issue 73: where the training
# step's time goes on an H200"):
#
#     bash bench/standalone/gpu_train_profile.sh NANOGPT_CHECKOUT RESULTS_DIR [MORE train_step_profile FLAGS]
#
# GPT-2 124M, batch 12 x 1024, bf16, compiled: train.py's step (loss and norm checked on the device), the same step
# reading them back before its update, that step with the loss over the logits' real-vocabulary slice, and nanoGPT's
# loop, timed interleaved and then profiled
# (bench/standalone/train_step_profile.py).  Writes RESULTS_DIR/train_step_profile.{json,md,log} and gpu.txt.
set -uo pipefail
nanogpt=${1:?usage: gpu_train_profile.sh NANOGPT_CHECKOUT RESULTS_DIR}
results=${2:?usage: gpu_train_profile.sh NANOGPT_CHECKOUT RESULTS_DIR}
extra=("${@:3}")  # a rehearsal elsewhere: --shape tiny:2x64 --device cpu --no-compile ...
mkdir -p "$results"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$results/gpu.txt" 2>&1
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' >>"$results/gpu.txt"
# The progress bars and the profiler's start/stop lines are left out of the log.  With the proposed loss path as a
# fourth side first; should that not finish in time, again without it (the compiled graphs are cached by then).
profile() {
    timeout "$1" python3 -m bench.standalone.train_step_profile --nanogpt "$nanogpt" --compile \
        --results-dir "$results" "${@:2}" "${extra[@]}" 2>&1 | grep -v -e 'USDT' -e 'it/s]' -e 's/it]' | tee -a "$results/train_step_profile.log"
}
profile "${FIRST_TRY_S:-270}" --loss-over-slice || profile "${SECOND_TRY_S:-120}"
