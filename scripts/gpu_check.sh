#!/usr/bin/env bash
# The GPU check after a change, in one device call: the suite (pytest -n WORKERS; its tests/test_mutants.py
# judges every mutant of the corpus on its named killers, so no separate corpus run repeats that work), the GPU
# half of the documentation's claims (scripts/check_claims.py --backend gpu), and verify's evidence runs
# (scripts/gpu_verify_real.sh with SET=final; stress runs of the plain formulations for SEEDS, default none), side
# by side on the one GPU and all cut at TOTAL seconds. Results under $OUT, as few files (a device call brings back
# eight at most). Usage: OUT=dir [TOTAL=420] [WORKERS=8] [JOBS=6] [CLAIMS=update] [SEEDS="0 1"] bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
TOTAL=${TOTAL:-420}
# SIGINT at the limit: pytest then still prints its summary (the failures' names) and writes the JUnit XML
(timeout -s INT -k 30 "$TOTAL" python -m pytest -n "${WORKERS:-8}" --dist worksteal -p no:cacheprovider -q -rfE --tb=short \
    --durations=15 --junitxml="$OUT/junit.xml" > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest.log") &
# CLAIMS=update: rewrite the GPU transcripts that differ, and bring the documents back in claims_docs.tar.gz
(timeout "$TOTAL" python scripts/check_claims.py --backend gpu ${CLAIMS:+--$CLAIMS} > "$OUT/claims.log" 2>&1
 echo "claims rc=$?" >> "$OUT/claims.log"
 [[ ${CLAIMS:-} == update ]] && tar -czf "$OUT/claims_docs.tar.gz" README.md examples/README.md docs/*.md) &
SET=final SEEDS=${SEEDS-} FORMS=${FORMS:-matmul_softmax einsum sdpa_math} JOBS=${JOBS:-6} TOTAL=$((TOTAL - 40)) LIMIT=$((TOTAL - 50)) OUT="$OUT/verify" \
    bash scripts/gpu_verify_real.sh > "$OUT/verify.log" 2>&1
wait
echo "=== pytest"; grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$OUT/pytest.log" | tail -25
echo "=== mutants (tests/test_mutants.py::test_mutant_is_killed)"
python - "$OUT/junit.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = [c for c in ET.parse(sys.argv[1]).getroot().iter("testcase") if c.get("name", "").startswith("test_mutant_is_killed[")]
bad = [c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None]
skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
print(f"{len(cases) - len(bad) - len(skipped)} mutants killed by their named killers, {len(bad)} not: {bad}; "
      f"{len(skipped)} skipped")
PY
echo "=== claims"; tail -6 "$OUT/claims.log"
echo "=== verify"; cat "$OUT/verify.log" | grep -v "UserWarning\|out = F.scaled" | head -60
tar -czf "$OUT/logs.tar.gz" -C "$OUT" pytest.log claims.log verify.log junit.xml 2>/dev/null \
    && rm -f "$OUT/pytest.log" "$OUT/claims.log" "$OUT/verify.log" "$OUT/junit.xml"
