#!/usr/bin/env bash
# One-command set-up on a fresh machine: a virtual environment in .venv with flashcheck and its test extras.
# The CPU build of torch is installed first when no torch is present (an unpinned torch may pull a CUDA
# build of several GB); set FLASHCHECK_TORCH to choose another pin, or install your own torch beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv --system-site-packages .venv
source .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
    python -m pip install -q "torch==${FLASHCHECK_TORCH:-2.13.0}"
fi
python -m pip install -q -e ".[test]"
python -c "import torch, triton, numpy, hypothesis, xdist; print('flashcheck ready: torch', torch.__version__, '| triton', triton.__version__)"
