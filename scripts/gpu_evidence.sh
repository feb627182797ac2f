#!/usr/bin/env bash
# Repeatability and scaling on a GPU runner: the suite N times with different hypothesis seeds on all
# visible GPUs, once on GPU 0 alone, and the property tests under the thorough profile.
# Usage: OUT=dir RUNS=5 WORKERS=16 bash scripts/gpu_evidence.sh
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
for seed in $(seq 1 "${RUNS:-5}"); do
    run "suite, all GPUs, seed $seed" FLASHCHECK_WORKER_LOG="$OUT/workers.log" \
        python -m pytest -n "${WORKERS:-16}" -p no:cacheprovider -q --hypothesis-seed="$seed"
done
run "suite, GPU 0 only" CUDA_VISIBLE_DEVICES=0 python -m pytest -n "${WORKERS:-16}" -p no:cacheprovider -q
run "properties, thorough" FLASHCHECK_HYPOTHESIS_PROFILE=thorough \
    python -m pytest -n "${WORKERS:-16}" -p no:cacheprovider -q -m properties
sed "s/.*: GPU/GPU/" "$OUT/workers.log" | sort | uniq -c | tee -a "$LOG"
