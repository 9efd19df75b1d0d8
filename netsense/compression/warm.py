"""Warming a sparse method's kernels when its hook is registered on CUDA, so no one-time cost is priced as a
recurring one.

On a GPU the first call of each kernel loads it (CUDA's lazy module loading), and the caching allocator's first
request of a size is a cudaMalloc: on an H200 step 0's selection took 0.13-0.24 s against ~1 ms later
(testbed/results/gpu-check-h200.md), and tta, which measures what selection costs, priced that once as every
sparse step's. ``warm`` runs the bucket's selection (the state's own mode, exact or sampled), packing, error
feedback and decode once for each size a bucket will have and each density class the policy may choose, on
dummy tensors, with a throwaway compressor and memory: the run's own state (random streams, residuals,
workspaces) is untouched. Kernels choose their code paths by size (``torch.topk``'s, a scan's block count), so
the sizes are the buckets': DDP's initial ones, and the ones it rebuilds after step 0 (estimated: parameters in
reverse order, the first bucket at most 1 MiB, then ``bucket_bytes_cap``).

``register`` calls it where the model lives on CUDA only (``device.type == 'cuda'``); on a CPU nothing is
lazily loaded and the native kernels are built beforehand (native.library()). Tests call it on the CPU too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist

from netsense.compression.compressor import TopK
from netsense.compression.memory import ResidualMemory

DENSITIES = (0.001, 0.01, 0.1)  # one per decade a controller's density moves in (minDensity 0.001 by default)
FIRST_BUCKET_BYTES = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1 << 20)


class _Bucket:
    """What TopK reads of a dist.GradBucket, over a dummy buffer (no parameters: nothing to lay out)."""

    def __init__(self, index: int, buffer: torch.Tensor) -> None:
        self._index, self._buffer = index, buffer

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return []

    def parameters(self) -> list[torch.Tensor]:
        return []


def bucket_sizes(model: torch.nn.parallel.DistributedDataParallel) -> list[int]:
    """Elements of each distinct bucket size DDP has now and will have after its rebuild (estimated), ascending."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return []
    width = params[0].element_size()
    sizes: set[int] = set()
    try:  # the buckets as built at construction (bytes, comma-separated)
        logged = str(model._get_ddp_logging_data().get("bucket_sizes", ""))
        sizes.update(int(b) // width for b in logged.replace(" ", "").split(",") if b.isdigit() and int(b) > 0)
    except (AttributeError, RuntimeError, ValueError):
        pass
    # The rebuild after step 0: buckets filled in the order gradients became ready (about the parameters'
    # reverse order), each closed once it reaches its limit, as torch's _compute_bucket_assignment_by_size does.
    limit, current = FIRST_BUCKET_BYTES, 0
    cap = int(getattr(model, "bucket_bytes_cap", 25 << 20))
    for p in reversed(params):
        current += p.numel() * p.element_size()
        if current >= limit:
            sizes.add(current // width)
            current, limit = 0, cap
    if current:
        sizes.add(current // width)
    return sorted(sizes)


def warm(selection: str, sizes: Iterable[int], device: torch.device | str, densities: Iterable[float] = DENSITIES,
         fp16s: Iterable[bool] = (True,), world: int = 2) -> list[tuple[int, int, bool]]:
    """Run selection + packing + error feedback + decode once per (size, density, fp16) on dummy tensors;
    returns the (n, k, fp16) warmed. Nothing of a run's own state is used or changed."""
    device = torch.device(device)
    topk = TopK(seed=0, rank=0, selection=selection)  # a throwaway: its own generators and workspaces
    memory = ResidualMemory()
    gen = torch.Generator(device=device).manual_seed(0)
    done = []
    for i, n in enumerate(sizes):
        grad = torch.randn(n, generator=gen, device=device)
        bucket = _Bucket(i, grad)
        for k in sorted({max(1, min(n, math.ceil(d * n))) for d in densities}):
            for fp16 in fp16s:
                packed = topk.compress(bucket, k, fp16, 0.0, memory)
                TopK.decompress(torch.empty(n, device=device), [packed] * world, k, fp16, world)
                done.append((n, k, fp16))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return done
