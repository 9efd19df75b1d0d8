#!/usr/bin/env bash
# The GPU path in one go: testbed/gpu/check.sh [--dry] [--out DIR]
# On a machine with CUDA: the compression tests' CUDA variants, a 2-rank job sharing the GPU over gloo on
# shaped links (static and step profiles), a world-size-1 NCCL smoke of every method's hook, and selection
# overhead against ResNet18/VGG16 compute steps. Without CUDA (or with --dry) the same steps run on the CPU
# where they can and say what they skipped and why; CI runs that dry mode (tests/test_gpu_check.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
# A Python with torch: the repo's venv, or one over a system torch (a GPU machine that cannot reach PyPI),
# or a fresh `make venv`.
if [[ ! -x .venv/bin/python ]]; then
  if python3 -c 'import torch' 2>/dev/null; then
    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install -q --no-deps --no-build-isolation -e . || .venv/bin/pip install -q -e .
  else
    make venv
  fi
fi
exec .venv/bin/python testbed/gpu/check.py "$@"
