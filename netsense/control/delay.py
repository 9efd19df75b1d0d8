"""dc2: a delay-driven peer in the manner of DC2 (Abdelmoniem and Canini, INFOCOM 2021), rebuilt from
the paper's description (no code of theirs is used): compression is steered by the delay the
collectives add, not by a bandwidth model. Each step's communication delay t (the collectives' busy
time) is held near a budget, ``target`` x the step's compute time C (1: the network may take as long
as the compute), by a multiplicative update of the TopK density::

    d <- clamp(d * (target * C / t) ** gain, min_density, 1)

gain < 1 damps the steps' noise. It starts uncompressed (DC2 compresses only when delays call for
it) and sends the dense all-reduce while a sparse all_gather of d would carry more bytes.
"""

from __future__ import annotations

import math

from netsense.control.cost import dense_allreduce_bytes, sparse_allgather_bytes
from netsense.control.decision import Decision, Policy, StepMeasurement, smoothed


class DelayDriven(Policy):
    """dc2: DC2's delay-driven compression, rebuilt from the paper's description: the module's docstring."""

    def __init__(self, numel: int, world: int, target: float = 1.0, gain: float = 0.5, min_density: float = 0.001,
                 fp16: bool = False):
        self.numel, self.world, self.fp16 = numel, world, fp16
        self.target, self.gain, self.min_density = target, gain, min_density
        self.density = 1.0
        self.compute_s = 0.0

    def update(self, m: StepMeasurement) -> None:
        self.compute_s = smoothed(self.compute_s, m.compute_seconds)
        if m.comm_seconds <= 0 or m.wire_bytes <= 0:
            return
        scaled = self.density * (self.target * self.compute_s / m.comm_seconds) ** self.gain
        self.density = min(1.0, max(self.min_density, scaled))

    def decide(self) -> Decision:
        k = math.ceil(self.density * self.numel)
        if sparse_allgather_bytes(k, self.world, self.fp16) >= dense_allreduce_bytes(self.numel, self.world):
            return Decision()
        return Decision(density=self.density, dense=False, fp16=self.fp16)

    def estimates(self) -> dict:
        return {"delay_budget_s": self.target * self.compute_s}
