#!/usr/bin/env bash
# Repeatability and scaling on a GPU runner: the suite N times with different hypothesis seeds on all
# visible GPUs, once on GPU 0 alone, and the property tests under the thorough profile.
# Usage: OUT=dir RUNS=5 WORKERS=16 [STEPS="suite single thorough"] bash scripts/gpu_evidence.sh
# Measured on a two-GPU H200 host: a suite run takes 62-106 s, the GPU-0 run 73 s, and the thorough properties
# 489 s (36 tests, 14 workers on one GPU; the slowest property alone takes 307 s); pick STEPS to fit a call's
# time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG="$OUT/evidence.log"
run() {  # label, env..., -- pytest args...
    local label=$1; shift; local t0=$SECONDS
    env "$@" > "$OUT/last.log" 2>&1; local rc=$?
    echo "$label: rc=$rc wall=$((SECONDS - t0))s $(tail -1 "$OUT/last.log")" | tee -a "$LOG"
    grep -E "^(FAILED|ERROR)" "$OUT/last.log" | head -20 | tee -a "$LOG"
}
STEPS=" ${STEPS:-suite single thorough} "
if [[ $STEPS == *" suite "* ]]; then
    for seed in $(seq 1 "${RUNS:-5}"); do
        run "suite, all GPUs, seed $seed" FLASHCHECK_WORKER_LOG="$OUT/workers.log" \
            python -m pytest -n "${WORKERS:-16}" -p no:cacheprovider -q --hypothesis-seed="$seed"
    done
    sed "s/.*: GPU/GPU/" "$OUT/workers.log" | sort | uniq -c | tee -a "$LOG"
fi
if [[ $STEPS == *" single "* ]]; then
    run "suite, GPU 0 only" CUDA_VISIBLE_DEVICES=0 python -m pytest -n "${WORKERS:-16}" -p no:cacheprovider -q
fi
if [[ $STEPS == *" thorough "* ]]; then
    run "properties, thorough" FLASHCHECK_HYPOTHESIS_PROFILE=thorough \
        python -m pytest -n "${WORKERS:-16}" -p no:cacheprovider -q -m properties --hypothesis-show-statistics
fi
