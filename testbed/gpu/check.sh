#!/usr/bin/env bash
# The GPU path in one go: testbed/gpu/check.sh [--dry] [--out DIR]
# On a machine with CUDA: the compression tests' CUDA variants, a 2-rank job sharing the GPU over gloo on
# shaped links (static and step profiles), a world-size-1 NCCL smoke of every method's hook, and selection
# overhead against ResNet18/VGG16 compute steps. Without CUDA (or with --dry) the same steps run on the CPU
# where they can and say what they skipped and why; CI runs that dry mode (tests/test_gpu_check.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
# A Python with torch: the repo's venv; or, on a GPU machine that cannot reach PyPI, the python3 that holds
# torch: used as it is (with the repo on PYTHONPATH) where it is itself a virtualenv, whose packages a venv
# made from it would not see, else through a venv over its system packages; or a fresh `make venv`.
PY=.venv/bin/python
if [[ ! -x $PY ]]; then
  if python3 -c 'import torch' 2>/dev/null; then
    if python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
      PY=$(command -v python3)
      export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    else
      python3 -m venv --system-site-packages .venv
      .venv/bin/pip install -q --no-deps --no-build-isolation -e . || .venv/bin/pip install -q -e .
    fi
  else
    make venv
  fi
fi
exec "$PY" testbed/gpu/check.py "$@"
