"""What a step costs: the bytes a rank puts on the wire for each collective, and the compressor's own
seconds, fitted online.

Wire bytes per rank, with v bytes a value (4 fp32, 2 fp16) and 4 an int32 index, at N workers::

    ring allreduce of n elements       2 (N - 1) / N x n x v
    ring all_gather of k values        (N - 1) x k x (v + 4)
    PowerSGD at rank r                 allreduce(sum min(r, n, m) n + whole) + allreduce(sum min(r, n, m) m)

and the compressor's own seconds a step as ``fixed + per_element * k`` (SelectionCost).
"""

from __future__ import annotations

import math
from collections import deque

VALUE_BYTES = {False: 4, True: 2}  # fp32 / fp16
INDEX_BYTES = 4  # int32


def dense_allreduce_bytes(n: int, world: int, fp16: bool = False) -> float:
    """Ring allreduce: each rank sends 2(N-1)/N of the buffer."""
    return 2 * (world - 1) / world * n * VALUE_BYTES[fp16] if world > 1 else 0.0


def sparse_allgather_bytes(k: int, world: int, fp16: bool = False) -> float:
    """Ring all_gather of k values + k int32 indices: each rank sends (N-1) chunks."""
    return (world - 1) * k * (VALUE_BYTES[fp16] + INDEX_BYTES)


def lowrank_allreduce_bytes(shapes: list[tuple[int, int]], vector_elements: int, rank: int, world: int,
                            fp16: bool = False) -> float:
    """PowerSGD's wire per rank: the P's and the vectors in one all_reduce, the Q's in a second (2 bytes an
    element with ``fp16``: the factors cast for the wire only)."""
    p = sum(min(rank, n, m) * n for n, m in shapes) + vector_elements
    q = sum(min(rank, n, m) * m for n, m in shapes)
    return dense_allreduce_bytes(p, world, fp16) + dense_allreduce_bytes(q, world, fp16)


class SelectionCost:
    """Selection time per step as ``fixed + per_element * k``, fitted online.

    Selecting TopK costs a pass over the whole gradient whatever k is (sampling,
    thresholds, the scan: the fixed part) plus packing and decoding the k chosen
    entries (the per-element part). Only the per-element part is a price of
    sending more, so only it is weighed against the wire. It is the slope of a
    least-squares line through the last ``window`` (k, seconds) points; while k
    has barely varied the slope cannot be told apart from the intercept, and the
    whole cost is charged per element (an over-estimate: it compresses more).

    ``unfitted="fixed"`` charges it all to the intercept instead, for a cost whose
    k takes a few values and stays at one unless the price says otherwise:
    PowerSGD's rank. Charged per rank, rank 4's own work priced rank 8 at twice
    it, so a run that started at rank 4 never tried rank 8 and one that started
    at 8 kept it (dev-halt-set2: each cell stayed at its first rank, about half
    at each, while set 2's measured own work was 7.4 ms at rank 4 and 7.8 at 8).
    Charged as fixed, an untried rank is priced at the work measured at the
    tried one: it runs if that wins, and its own measurement then fits the line.
    """

    def __init__(self, window: int = 16, min_spread: float = 0.1, unfitted: str = "per_element"):
        if unfitted not in ("per_element", "fixed"):
            raise ValueError(f"unfitted {unfitted!r}: per_element or fixed")
        self.points: deque[tuple[float, float]] = deque(maxlen=window)
        self.min_spread = min_spread
        self.unfitted = unfitted
        self.slope: float | None = None
        self.intercept = 0.0

    def add(self, elements: float, seconds: float) -> None:
        if elements > 0 and seconds > 0:
            self.points.append((elements, seconds))
            self._fit()

    def _fit(self) -> None:
        n = len(self.points)
        km = sum(k for k, _ in self.points) / n
        sm = sum(t for _, t in self.points) / n
        var = sum((k - km) ** 2 for k, _ in self.points) / n
        if n >= 3 and math.sqrt(var) >= self.min_spread * km:
            cov = sum((k - km) * (t - sm) for k, t in self.points) / n
            self.slope = min(max(0.0, cov / var), sm / km)
        elif self.slope is None:  # kept once fitted, as the intercept moves with the mean
            self.slope = sm / km if self.unfitted == "per_element" else 0.0
        self.intercept = max(0.0, sm - self.slope * km)

    @property
    def per_element(self) -> float:
        return self.slope or 0.0
