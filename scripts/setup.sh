#!/usr/bin/env bash
# One-command set-up on a fresh machine: a virtual environment in .venv with flashcheck (editable), its test
# and plot extras (pytest, pytest-xdist, hypothesis; matplotlib for the HTML report), and the packaging tools
# build and twine (used by scripts/wheel_smoke.sh; not dependencies of flashcheck).
#
# What it downloads. When no torch is importable it first installs torch==$FLASHCHECK_TORCH (default 2.13.0):
# on these machines pip finds a CPU build on the local disk and installs it in seconds; elsewhere pip may
# download the CUDA build of torch from the package index, several GB (to avoid that, install a CPU build into
# .venv first: pip install torch --index-url https://download.pytorch.org/whl/cpu). Then, from the package index:
# triton (about 200 MB), numpy, the test and plot extras, build and twine. pip shows each download.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv --system-site-packages .venv
source .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
    echo "setup: no torch here: installing torch==${FLASHCHECK_TORCH:-2.13.0} (a CPU build from the local disk on" \
         "these machines; elsewhere pip may download the CUDA build, several GB)"
    python -m pip install "torch==${FLASHCHECK_TORCH:-2.13.0}"
fi
echo "setup: installing flashcheck (editable) with its test and plot extras, and build and twine"
python -m pip install -e ".[test,plot]" build twine
python -c "import torch, triton, numpy, hypothesis, xdist, matplotlib, build, twine
print('flashcheck ready: torch', torch.__version__, '| triton', triton.__version__)"
