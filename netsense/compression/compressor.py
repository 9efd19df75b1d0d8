"""The compressor (GRACE's split: compressor, memory, communicator): exact TopK of the error-compensated
gradient, optionally skipping the smallest weights (pruning), packed as ``k`` int32 indices then ``k``
values; and the inverse, summing every rank's packed chunk into the bucket as ``index_add_`` would
(colliding indices sum, signs kept):

    g_avg = (1/N) * sum_r scatter_add(indices_r, values_r)

Pruning leaves the smallest-|weight| entries out of the ranking while at least k entries survive it; where
fewer survive (a pruneFactor near 1), that step ranks every entry, pruned ones too.

On CPUs both directions run in fused kernels (native.cpp); on GPUs, or where no compiler is found, in eager
PyTorch. The two select the same entries and decode alike (tested, step after step), so ranks may even mix
them. With ``selection: sampled`` (spec.compression) the selection is sampled.py's instead, on any device: a
sampled threshold and fixed-size outputs, no host synchronization, the exact top k with probability at least
``1 - sampled.count_bound(n, k)`` (padding slots of value 0 otherwise); the same packed format and decode.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from netsense.compression import native, sampled
from netsense.compression.memory import ResidualMemory
from netsense.compression.selection import (
    Workspace,
    prune_threshold,
    smallest_fraction_mask,
    topk_indices,
)


class TopK:
    """Per-bucket buffers and fused selectors (reused across steps: DDP finishes a bucket before its next
    step begins), and one random generator per device for the sampled thresholds, seeded per rank.

    ``selection``: ``exact`` (the native kernels on CPUs, selection.py elsewhere) or ``sampled`` (sampled.py;
    pruning, netsense's alone, always takes the exact path)."""

    SELECTIONS = ("exact", "sampled")

    def __init__(self, seed: int, rank: int, selection: str = "exact"):
        if selection not in self.SELECTIONS:
            raise ValueError(f"selection {selection!r}: one of {', '.join(self.SELECTIONS)}")
        self.seed, self.rank, self.selection = seed, rank, selection
        self.workspaces: dict[int, Workspace] = {}
        self.selectors: dict[int, native.Selector] = {}
        self._generators: dict[tuple[torch.device, str], torch.Generator] = {}

    def generator(self, device: torch.device, stream: str = "select") -> torch.Generator:
        """The random generator of one use (``select``: TopK's sampled thresholds; ``prune``: the pruning
        threshold's sample): one stream each, so the native and the PyTorch paths, which draw differently for
        selection, draw the same pruning thresholds step after step."""
        key = (device, stream)
        if key not in self._generators:
            offset = {"select": 0, "prune": 104729}[stream]
            self._generators[key] = torch.Generator(device=device).manual_seed(self.seed + 7919 * self.rank + offset)
        return self._generators[key]

    def workspace(self, bucket: dist.GradBucket) -> Workspace:
        return self.workspaces.setdefault(bucket.index(), Workspace())

    def compress(self, bucket: dist.GradBucket, k: int, fp16: bool, prune: float,
                 memory: ResidualMemory | None) -> torch.Tensor:
        """The bucket's packed (indices, values); with memory, what is not sent stays in it."""
        if self.selection == "sampled" and prune <= 0:
            return self._sampled(bucket, k, fp16, memory)
        if native.usable(bucket.buffer()):
            return self._native(bucket, k, fp16, prune, memory)
        return self._torch(bucket, k, fp16, prune, memory)

    def _native(self, bucket: dist.GradBucket, k: int, fp16: bool, prune: float,
                memory: ResidualMemory | None) -> torch.Tensor:
        """Fused kernels: error feedback, exact TopK and packing in about one pass."""
        buf = bucket.buffer()
        gen = self.generator(buf.device)
        weights, prune_below = None, 0.0
        if prune > 0:
            weights = _flat_weights(bucket, self.workspace(bucket))
            if weights is not None:
                prune_below = prune_threshold(weights, prune, self.generator(buf.device, "prune"))
        signal = memory.slot(*_keyed(bucket)) if memory is not None else buf
        selector = self.selectors.setdefault(bucket.index(), native.Selector())
        return selector.select(signal, buf if memory is not None else None, k, fp16, memory is not None,
                               gen, weights, prune_below)

    def _torch(self, bucket: dist.GradBucket, k: int, fp16: bool, prune: float,
               memory: ResidualMemory | None) -> torch.Tensor:
        """The same selection in eager PyTorch."""
        buf, ws = bucket.buffer(), self.workspace(bucket)
        gen = self.generator(buf.device)
        signal = memory.compensate(*_keyed(bucket)) if memory is not None else buf
        magnitude = torch.abs(signal, out=ws.get("magnitude", buf.numel(), buf.dtype, buf.device))
        if prune > 0:
            weights = _flat_weights(bucket, ws)
            if weights is not None:
                pruned = smallest_fraction_mask(weights, prune, self.generator(buf.device, "prune"), ws)
                if buf.numel() - int(pruned.sum()) >= k:  # else every entry is ranked, as the native path does
                    magnitude.masked_fill_(pruned, 0)
        indices = topk_indices(magnitude, k, gen, ws)
        values = signal[indices].to(torch.float16 if fp16 else buf.dtype)
        if memory is not None:
            ResidualMemory.sent(signal, indices, values)
        # Indices first: 4k bytes keep the values' offset aligned for any dtype view.
        return torch.cat([indices.to(torch.int32).view(torch.uint8), values.view(torch.uint8)])

    def _sampled(self, bucket: dist.GradBucket, k: int, fp16: bool, memory: ResidualMemory | None) -> torch.Tensor:
        """sampled.py's selection: fixed sizes, no host synchronization."""
        buf, ws = bucket.buffer(), self.workspace(bucket)
        signal = memory.compensate(*_keyed(bucket)) if memory is not None else buf
        n = buf.numel()
        return sampled.compress(signal, k, fp16, self.generator(buf.device),
                                ws.get("magnitude", n, buf.dtype, buf.device), ws.get("mask", n, torch.bool, buf.device),
                                error_feedback=memory is not None)

    @staticmethod
    def decompress(buf: torch.Tensor, gathered: list[torch.Tensor], k: int, fp16: bool, world: int,
                   capacity: int | None = None) -> torch.Tensor:
        """buf = the mean over ranks of their scattered chunks: the first k of each chunk's ``capacity``
        (default k) indices and values; a padded probe's zeros after them are never read."""
        capacity = capacity or k
        if native.usable(buf):
            native.decode(buf, gathered, k, fp16, world, capacity)
            return buf
        value_dtype = torch.float16 if fp16 else buf.dtype
        value_bytes = 2 if fp16 else buf.element_size()
        buf.zero_()
        for chunk in gathered:
            i = chunk[:4 * k].view(torch.int32).to(torch.long)
            v = chunk[4 * capacity:4 * capacity + value_bytes * k].view(value_dtype).to(buf.dtype).div_(world)
            buf.index_add_(0, i, v)  # accumulate: colliding indices from ranks sum
        return buf


def _keyed(bucket: dist.GradBucket) -> tuple:
    """(index, buffer, per-parameter views, parameters): how error feedback finds a bucket's residual, which
    follows its parameters through DDP's bucket rebuild (memory.ParameterLayout)."""
    return bucket.index(), bucket.buffer(), bucket.gradients(), bucket.parameters()


def _flat_weights(bucket: dist.GradBucket, ws: Workspace) -> torch.Tensor | None:
    """The bucket's weights in the buffer's layout (None if the layouts differ)."""
    params = bucket.parameters()
    buf = bucket.buffer()
    if not params or sum(p.numel() for p in params) != buf.numel():
        return None
    out = ws.get("weights", buf.numel(), buf.dtype, buf.device)
    return torch.cat([p.detach().reshape(-1) for p in params], out=out)
