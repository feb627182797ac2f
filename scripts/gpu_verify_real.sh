#!/usr/bin/env bash
# verify on the kernels people ship, on a GPU runner, in one go: PyTorch's SDPA backends and flex_attention
# (examples/sdpa_backends.py, examples/flex_attention.py), the SDPA example under three seeds, the plain
# PyTorch formulations and the project's kernels with many generated cases (a false alarm there is a defect
# of flashcheck), the --fused memory check, --sanitize, and the SDPA backend probe. Jobs run in parallel on
# the one GPU (JOBS at a time, each under its own time limit); every run writes its JSON under $OUT/runs, and
# the last step prints one line per run. RUN_JOBS=N gives each stress run `verify --jobs N` (a run of 500
# generated cases of a Triton kernel is compile-bound: about 850 s of one core for the fused kernel on an H200).
# Usage: OUT=dir [JOBS=12] [SEEDS="0 1" (SEEDS="": no stress runs)] [EXAMPLES=500] [RUN_JOBS=1]
#        bash scripts/gpu_verify_real.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT/runs"
# many verify runs share the machine's cores: one or two threads each, not one per core each
export PYTHONPATH=. PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
JOBS=${JOBS:-12}; LIMIT=${LIMIT:-420}; EXAMPLES=${EXAMPLES:-500}; SEEDS=${SEEDS-"0 1 2 3 4 5 6 7 8 9"}
{ nvidia-smi -L; python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; } > "$OUT/device.txt" 2>&1
python scripts/sdpa_probe.py > "$OUT/sdpa_probe.txt" 2>&1 &
jobs_file=$OUT/jobs.txt; : > "$jobs_file"
job() { echo "$1|${*:2}" >> "$jobs_file"; }   # name|verify arguments
# SET=final: the evidence that must be re-run after a change (fewer and shorter runs); SET=full: everything
# SET=stress: only the stress runs, for SEEDS and FORMS (plain formulations or "fused"/"unfused")
if [[ ${SET:-full} == stress ]]; then
  :   # the stress runs below, nothing before them
elif [[ ${SET:-full} == final ]]; then
  for s in 1 2 3; do job "sdpa_example_seed$s" "examples/sdpa_attention.py:attention --examples 400 --seed $s"; done
  job plain_matmul_softmax "examples/plain_attention.py:matmul_softmax"
  job plain_fused_check_must_fail "examples/plain_attention.py:matmul_softmax --fused --only one_query"
  # --fused must pass the fused kernel and SDPA and fail the kernels that materialise the scores (unfused, plain)
  job fused_fused_check "flashcheck.kernel.fused:attention --fused --only one_query,long_cross_decode"
  job unfused_fused_check_must_fail "flashcheck.kernel.unfused:attention --fused --only one_query,long_cross_decode"
  job sdpa_fused_check "examples/sdpa_attention.py:attention --fused --only one_query,long_cross_decode"
  job sanitize_fused "flashcheck.kernel.fused:attention --sanitize --only partial_last_key_block,causal_nq_gt_nk,head_dim_17"
  for k in flash cudnn efficient; do job "sdpa_$k" "examples/sdpa_backends.py:$k --examples 10"; done
else
for k in flash efficient cudnn math; do job "sdpa_$k" "examples/sdpa_backends.py:$k"; done
job flex "examples/flex_attention.py:attention --examples 10"
for s in 1 2 3; do job "sdpa_example_seed$s" "examples/sdpa_attention.py:attention --examples 400 --seed $s"; done
for f in matmul_softmax einsum sdpa_math in_dtype; do job "plain_$f" "examples/plain_attention.py:$f"; done
for k in fused unfused; do job "$k" "flashcheck.kernel.$k:attention"; done
job fused_fused_check "flashcheck.kernel.fused:attention --fused --only one_query"
job unfused_fused_check_must_fail "flashcheck.kernel.unfused:attention --fused --only one_query"
job plain_fused_check_must_fail "examples/plain_attention.py:matmul_softmax --fused --only one_query"
job sdpa_fused_check "examples/sdpa_attention.py:attention --fused --only one_query"
job sanitize_fused "flashcheck.kernel.fused:attention --sanitize --only partial_last_key_block,causal_nq_gt_nk,head_dim_17"
job sanitize_mutant "mutant:kv_mask_plus --sanitize --only partial_last_key_block,nk_lt_block_n"
fi
# every set ends with the stress runs, seed by seed, each formulation in turn (a cut batch still covers every
# formulation): the plain PyTorch ones and the project's kernels (FORMS picks some)
for s in $SEEDS; do
  for f in ${FORMS:-matmul_softmax einsum sdpa_math fused unfused}; do
    case $f in fused|unfused) target="flashcheck.kernel.$f:attention";; *) target="examples/plain_attention.py:$f";; esac
    job "stress_${f}_seed$s" "$target --only one_query --examples $EXAMPLES --seed $s --jobs ${RUN_JOBS:-1}"
  done
done
run_one() {
  local name=${1%%|*} args=${1#*|}
  local t0=$SECONDS
  # shellcheck disable=SC2086
  timeout "$LIMIT" python -m flashcheck verify $args -q --json "$OUT/runs/$name.json" > "$OUT/runs/$name.log" 2>&1
  echo "$name rc=$? wall=$((SECONDS - t0))s" >> "$OUT/runs/done.txt"
}
export -f run_one; export OUT LIMIT
# the whole batch stops at TOTAL seconds (runs still going are cut; their JSON says partial)
tr '\n' '\0' < "$jobs_file" | timeout -s INT "${TOTAL:-900}" xargs -0 -P "$JOBS" -I{} bash -c 'run_one "$@"' _ {}
wait
python - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
done_path = os.path.join(out, "runs", "done.txt")
done = dict(line.split(" ", 1) for line in open(done_path).read().splitlines()) if os.path.exists(done_path) else {}
queued = [line.split("|", 1)[0] for line in open(os.path.join(out, "jobs.txt")).read().splitlines()]
started = {f[:-5] for f in os.listdir(os.path.join(out, "runs")) if f.endswith((".json", ".log"))} | set(done)
for name in queued:
    done.setdefault(name, "(cut by TOTAL)")
    path = os.path.join(out, "runs", name + ".json")
    summary = "no JSON" if name in started else "not started (TOTAL reached)"
    if os.path.exists(path):
        d = json.load(open(path))
        s = d["summary"]
        summary = (f"pass {s['passed']} fail {s['failed']} inconcl {s['inconclusive']} unsup {s['unsupported']} "
                   f"oom {s['out_of_memory']} skip {s['skipped']}{' PARTIAL' if d['partial'] else ''}")
        fails = [c for c in d["cases"] if c["status"] == "fail"]
        kinds = sorted({c["kind"] for c in fails})
        if fails:
            summary += f" kinds {kinds} first {fails[0]['name']}: {fails[0]['failures'][0]['line'][:160]}"
    print(f"{name:34} {done[name]:22} {summary}")
PY
cat "$OUT/sdpa_probe.txt"
# few files come back from a device call: one archive of the runs
tar -czf "$OUT/runs.tar.gz" -C "$OUT" runs jobs.txt && rm -rf "$OUT/runs" "$OUT/jobs.txt"
