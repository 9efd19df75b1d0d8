"""The fixed policies: the same decision every step, whatever is measured. topk: TopK at one density;
powersgd: PowerSGD at one rank (netsense.compression.lowrank). Each sends its values or factors as ``fp16``
says."""

from __future__ import annotations

from netsense.control.decision import Decision, Policy, StepMeasurement


class Fixed(Policy):
    """``decision`` every step; nothing measured changes it."""

    decision: Decision
    measures = False  # so the ranks skip the step's agreement all_reduce: nothing would read it

    def update(self, m: StepMeasurement) -> None:
        pass

    def decide(self) -> Decision:
        return self.decision


class FixedDensity(Fixed):
    """topk: always the same density."""

    def __init__(self, density: float, fp16: bool = False):
        self.decision = Decision(density=density, dense=False, fp16=fp16)


class FixedLowRank(Fixed):
    """powersgd: always the same rank (PowerSGD, netsense.compression.lowrank), its factors as ``fp16`` says."""

    def __init__(self, rank: int, fp16: bool = False):
        self.decision = Decision(dense=False, rank=rank, fp16=fp16)
