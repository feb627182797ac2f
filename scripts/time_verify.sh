#!/usr/bin/env bash
# Time to verdict of the README's verify commands, as a user meets them: RUNS runs of each, one at a time, each a
# whole `flashcheck verify` process timed from outside, then min / median / max of the wall times.
#   cold: the fused kernel with an empty compile cache (FLASHCHECK_CACHE_DIR a fresh directory each run)
#   warm: the fused kernel again, its cache left by the last cold run (a second, unchanged run)
#   sdpa: examples/sdpa_attention.py:attention (torch's SDPA wrapped: nothing to compile)
# Every run must exit 0 (a run that does not is reported and stops the script with status 1); the logs and
# times go under $OUT. Usage: OUT=dir [RUNS=3] [WHAT="cold warm sdpa"] bash scripts/time_verify.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-time-out}; mkdir -p "$OUT"
RUNS=${RUNS:-3}
export PYTHONPATH=. PYTHONUNBUFFERED=1
unset TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR     # the README's commands: flashcheck's own cache directory
cache_root=$(mktemp -d)
one() {   # name run env... -- args...
  local name=$1 n=$2; shift 2
  local envs=() ; while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  local t0 t1 rc
  t0=$(date +%s.%N)
  env "${envs[@]}" python -m flashcheck verify "$@" > "$OUT/$name-$n.log" 2>&1; rc=$?
  t1=$(date +%s.%N)
  local wall; wall=$(python -c "print(f'{$t1 - $t0:.1f}')")
  echo "$name run $n: exit $rc, $wall s; $(tail -1 "$OUT/$name-$n.log")" | tee -a "$OUT/times.txt"
  echo "$name $wall" >> "$OUT/walls.txt"
  [[ $rc == 0 ]] || { echo "$name run $n exited $rc: see $OUT/$name-$n.log"; exit 1; }
}
for what in ${WHAT:-cold warm sdpa}; do
  for n in $(seq 1 "$RUNS"); do
    case $what in
      cold) rm -rf "$cache_root/c"; mkdir -p "$cache_root/c"; one cold "$n" FLASHCHECK_CACHE_DIR="$cache_root/c" -- ;;
      warm) if [[ ! -d $cache_root/c ]]; then     # no cold run before: one uncounted run fills the cache
              mkdir -p "$cache_root/c"; one fill 0 FLASHCHECK_CACHE_DIR="$cache_root/c" --; fi
            one warm "$n" FLASHCHECK_CACHE_DIR="$cache_root/c" -- ;;
      sdpa) one sdpa "$n" FLASHCHECK_CACHE_DIR="$cache_root/c" -- examples/sdpa_attention.py:attention ;;
    esac
  done
done
python - "$OUT/walls.txt" <<'PY' | tee -a "$OUT/times.txt"
import statistics, sys
walls = {}
for line in open(sys.argv[1]):
    name, t = line.split()
    walls.setdefault(name, []).append(float(t))
for name, ts in walls.items():
    print(f"{name}: {len(ts)} runs, wall min {min(ts):.1f} s, median {statistics.median(ts):.1f} s, max {max(ts):.1f} s")
PY
rm -rf "$cache_root"
