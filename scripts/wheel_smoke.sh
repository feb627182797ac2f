#!/usr/bin/env bash
# The distribution as a user gets it: build the sdist and the wheel (from the sdist) into a temporary folder,
# check them with twine, install the wheel with its test extra into a fresh virtual environment OUTSIDE the
# repository, and from a folder outside the repository run what a user runs: verify (the project's kernel, and
# a buggy one that must fail), the bug corpus (which reads the kernel's source from the installed package),
# the Python API, and the pytest plugin on a tiny scratch kernel repository. Prints one line per check and
# exits non-zero when any expectation fails.
#
# Downloads: torch==$FLASHCHECK_TORCH (default 2.13.0) goes into the fresh environment: on these machines a CPU
# build from the local disk, in seconds; elsewhere pip may download the CUDA build (several GB). Then triton,
# numpy, pytest, pytest-xdist, hypothesis (the wheel's dependencies and test extra), and build and twine for a
# build environment of their own: from the package index pip is configured with.
#
#   bash scripts/wheel_smoke.sh      KEEP=1 keeps the temporary folder (its path is printed); SMOKE_TMP=DIR puts it
#                                    in DIR; PYTHON=python3.X builds the fresh environment with another Python
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
TORCH_PIN="${FLASHCHECK_TORCH:-2.13.0}"
# the temporary folder holds two environments (about 1.5 GB, 40,000 files): in memory (/dev/shm) where it has
# room, since creating and deleting that many files on a busy disk takes minutes; SMOKE_TMP chooses another
if [ -z "${SMOKE_TMP:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ] \
        && [ "$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')" -gt $((4 * 1024 * 1024)) ]; then
    SMOKE_TMP=/dev/shm
fi
TMP="$(mktemp -d "${SMOKE_TMP:-${TMPDIR:-/tmp}}/flashcheck-wheel-smoke.XXXXXX")"
case "$TMP" in "$REPO"/*) echo "wheel_smoke: the temporary folder $TMP is inside the repository" >&2; exit 2;; esac
cleanup() { if [ -n "${KEEP:-}" ]; then echo "kept $TMP"; else rm -rf "$TMP"; fi; }
trap cleanup EXIT
unset PYTHONPATH VIRTUAL_ENV PYTEST_ADDOPTS
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
T0=$SECONDS
FAILED=0
REPORT=()

say() { echo "wheel_smoke: $*"; }
record() {   # record NAME STATUS DETAIL
    local line
    line=$(printf '%-4s %-44s %s' "$2" "$1" "$3")
    REPORT+=("$line")
    echo "$line"
    [ "$2" = ok ] || FAILED=1
}
# expect NAME CODE LOG -- COMMAND...: run COMMAND (output to LOG), which must exit with CODE
expect() {
    local name=$1 want=$2 log=$3; shift 4
    local t=$SECONDS
    "$@" >"$log" 2>&1
    local got=$?
    if [ "$got" = "$want" ]; then
        record "$name" ok "exit $got ($((SECONDS - t)) s)"
    else
        record "$name" FAIL "exit $got, expected $want ($((SECONDS - t)) s); the end of $log:"
        tail -n 25 "$log" | sed 's/^/     | /'
    fi
    return 0
}
must() { "$@" || { say "set-up failed: $*"; exit 1; }; }

# ---- build and check ----
# build and twine: the repository's .venv has them (scripts/setup.sh); else an environment of their own
TOOLS="$REPO/.venv/bin/python"
if ! "$TOOLS" -c "import build, twine" 2>/dev/null; then
    say "no build and twine in $REPO/.venv: installing them into $TMP/buildenv"
    must "$PY" -m venv "$TMP/buildenv"
    TOOLS="$TMP/buildenv/bin/python"
    must "$TOOLS" -m pip install -q --no-compile build twine
fi
say "building into $TMP/dist"
expect "build sdist and wheel (wheel from the sdist)" 0 "$TMP/build.log" -- \
    "$TOOLS" -m build --outdir "$TMP/dist" "$REPO"
WHEEL=$(ls "$TMP"/dist/flashcheck-*.whl 2>/dev/null | head -n 1)
[ -n "$WHEEL" ] || { say "no wheel was built"; exit 1; }
expect "twine check dist/*" 0 "$TMP/twine.log" -- "$TOOLS" -m twine check "$TMP"/dist/*
sed 's/^/     | /' "$TMP/twine.log"
expect "wheel: one import name, kernel sources, LICENSE" 0 "$TMP/contents.log" -- "$PY" - "$WHEEL" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
top = sorted({n.split("/")[0] for n in names})
print("top-level names:", ", ".join(top))
imports = [t for t in top if not t.endswith((".dist-info", ".data"))]
assert imports == ["flashcheck"], f"import names besides flashcheck: {imports}"
for needed in ("flashcheck/kernel/fused.py", "flashcheck/kernel/unfused.py", "flashcheck/cases/corpus/mutants.py",
               "flashcheck/api.py", "flashcheck/plugin.py"):
    assert needed in names, f"missing from the wheel: {needed}"
assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "no LICENSE in the wheel"
entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
text = zipfile.ZipFile(sys.argv[1]).read(entry).decode()
assert "[pytest11]" in text and "flashcheck = flashcheck.plugin" in text, text
EOF
grep "top-level names" "$TMP/contents.log" | sed 's/^/     | /'

# ---- a fresh environment outside the repository ----
say "fresh environment $TMP/venv: installing torch==$TORCH_PIN (a CPU build from the local disk on these machines;" \
    "elsewhere pip may download the CUDA build, several GB)"
must "$PY" -m venv "$TMP/venv"
V="$TMP/venv/bin"
t=$SECONDS
"$V/python" -m pip install --no-compile "torch==$TORCH_PIN" 2>&1 | grep -v "is neither a file nor a directory"
[ "${PIPESTATUS[0]}" = 0 ] || { say "installing torch failed"; exit 1; }
record "install torch==$TORCH_PIN" ok "($((SECONDS - t)) s)"
say "installing $(basename "$WHEEL")[test] (triton, about 200 MB, numpy, pytest, pytest-xdist, hypothesis)"
t=$SECONDS
"$V/python" -m pip install --no-compile "$WHEEL[test]" 2>&1 | grep -v "is neither a file nor a directory" \
    | grep -E "^(Downloading|Processing|Successfully|ERROR)"
[ "${PIPESTATUS[0]}" = 0 ] || { say "installing the wheel failed"; exit 1; }
record "install the wheel with its test extra" ok "($((SECONDS - t)) s)"
mkdir -p "$TMP/work"
cd "$TMP/work" || exit 1

expect "import flashcheck: from the wheel, no torch" 0 "$TMP/import.log" -- "$V/python" -c "
import sys, flashcheck
assert 'torch' not in sys.modules, 'import flashcheck imported torch'
assert flashcheck.__file__.startswith('$TMP/venv/'), flashcheck.__file__
print(flashcheck.__version__, flashcheck.__file__)"
expect "flashcheck verify (the project's kernel)" 0 "$TMP/verify.log" -- \
    "$V/flashcheck" verify --only hand_one_query_two_keys,partial_last_key_block --examples 0
expect "flashcheck verify examples/buggy_attention.py" 1 "$TMP/buggy.log" -- \
    "$V/flashcheck" verify "$REPO/examples/buggy_attention.py:attention" --only hand_one_query_two_keys
grep -q "got 5, expected 7.5" "$TMP/buggy.log" && record "  ... its report says got 5, expected 7.5" ok "" \
    || record "  ... its report says got 5, expected 7.5" FAIL "not in $TMP/buggy.log"
expect "flashcheck mutants --killers-only kv_mask_plus" 0 "$TMP/mutants.log" -- \
    "$V/flashcheck" mutants --killers-only --mutant kv_mask_plus
# the same mutant through the corpus's Python interface (kernel/fused.py read from the installed package), and
# the Python API
expect "corpus and API from the wheel" 0 "$TMP/api.log" -- "$V/python" -c "
import flashcheck
from flashcheck.cases.corpus import mutants
assert (mutants.KERNEL_DIR / 'fused.py').is_file() and str(mutants.KERNEL_DIR).startswith('$TMP/venv/'), \\
    mutants.KERNEL_DIR
flashcheck.select_backend()
results = mutants.kill(mutants.get('kv_mask_plus'), isolate=False)
print('kv_mask_plus:', [(c.name, v.status) for c, v in results])
assert mutants.killed(results), 'kv_mask_plus survived its killers, judged from the installed package'
r = flashcheck.verify('flashcheck.kernel.fused:attention', only='hand_one_query_two_keys[fp32]', isolate=False)
assert r.passed, str(r)
flashcheck.assert_attention('flashcheck.kernel.fused:attention', 'hand_one_query_two_keys[fp32]')
print(r.summary)"

# ---- the pytest plugin, through its entry point, on a scratch kernel repository ----
mkdir -p "$TMP/kernel-repo/pkg"
: >"$TMP/kernel-repo/pkg/__init__.py"
cat >"$TMP/kernel-repo/pkg/attn.py" <<'EOF'
import math

import torch


def forward(q, k, v, *, causal=False, scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if causal:
        nq, nk = q.shape[-2], k.shape[-2]
        s = s.masked_fill(~torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq), float("-inf"))
    return (torch.softmax(s, dim=-1).nan_to_num(0.0) @ v.double()).to(q.dtype)
EOF
cat >"$TMP/kernel-repo/test_own.py" <<'EOF'
def test_the_repository_own_test():
    assert True
EOF
cd "$TMP/kernel-repo" || exit 1
expect "pytest --flashcheck=pkg.attn:forward" 0 "$TMP/plugin.log" -- \
    "$V/python" -m pytest -p no:cacheprovider --flashcheck=pkg.attn:forward \
    --flashcheck-only hand_one_query_two_keys,partial_last_key_block,causal_square -v
grep -q "flashcheck::partial_last_key_block\[fp16\] PASSED" "$TMP/plugin.log" \
    && grep -Eq "[0-9]+ passed" "$TMP/plugin.log" && record "  ... items named flashcheck::CASE[dtype]" ok "" \
    || record "  ... items named flashcheck::CASE[dtype]" FAIL "see $TMP/plugin.log"
tail -n 1 "$TMP/plugin.log" | sed 's/^/     | /'

echo
echo "wheel smoke: $(basename "$WHEEL") in $((SECONDS - T0)) s"
for line in "${REPORT[@]}"; do echo "  $line"; done
passed=$(printf '%s\n' "${REPORT[@]}" | grep -c '^ok ')
failed=$(printf '%s\n' "${REPORT[@]}" | grep -c '^FAIL')
echo "wheel_smoke: $passed passed, $failed failed"
[ "$FAILED" = 0 ]
