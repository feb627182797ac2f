#!/usr/bin/env bash
# The GPU runner's whole check, in one go: the suite under pytest-xdist (one worker per GPU slot), the
# bug corpus's kill matrix, verify on the project's kernels and the examples, and compute-sanitizer.
# Writes logs under ${OUT:-gpu-out}. Usage: OUT=dir bash scripts/gpu_suite.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 FLASHCHECK_WORKER_LOG="$OUT/workers.log"
LOG="$OUT/gpu.log"
step() { echo "=== $* ($(date +%T))" | tee -a "$LOG"; }
timed() { local t0=$SECONDS; "$@" 2>&1 | tee -a "$LOG"; local rc=${PIPESTATUS[0]}; echo "--- rc=$rc wall=$((SECONDS - t0))s" | tee -a "$LOG"; return $rc; }
status=0
step "device"; nvidia-smi -L | tee -a "$LOG"; python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$LOG"
step "pytest"; timed python -m pytest -n "${WORKERS:-auto}" -p no:cacheprovider --junitxml="$OUT/junit.xml" "$@" || status=1
step "exhaustive sweeps (the fp32 paths tf32x3 and FMA over the whole fp32 catalogue)"
timed python -m pytest -n "${WORKERS:-auto}" -p no:cacheprovider -m exhaustive --junitxml="$OUT/junit-exhaustive.xml" || status=1
grep -o 'property name="[a-z_]*" value="[^"]*"' "$OUT/junit.xml" | tee -a "$LOG"
cat "$OUT/workers.log" >> "$LOG" 2>/dev/null
step "kill matrix"; timed python -m flashcheck mutants --json "$OUT/mutants.json" || status=1
for target in flashcheck.kernel.fused:attention flashcheck.kernel.unfused:attention examples/sdpa_attention.py:attention; do
  step "verify $target"; timed python -m flashcheck verify "$target" -q || status=1
done
step "verify examples/buggy_attention.py (must fail)"; timed python -m flashcheck verify examples/buggy_attention.py:attention -q && status=1
step "sanitize"; timed python -m flashcheck sanitize --target flashcheck.kernel.fused:attention --target flashcheck.kernel.unfused:attention \
    --mutant kv_mask_plus --mutant store_no_row_mask --mutant unfused_kv_mask_plus || status=1
step "done: status $status"
exit $status
