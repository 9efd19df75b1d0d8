"""What a ratio policy decides and what it learns from: the Decision a policy makes each step, the
StepMeasurement it then sees, and the Policy interface the policies implement (one a module: fixed, aimd, delay,
tta; cost holds the wire and compressor costs they price with).

Pure Python, no torch. Every policy sees only inputs that all ranks agree on
(the hook averages each rank's measurements with a tiny all_reduce before they
reach the policy), so every rank makes the same decision: the same density, the
same k, the same collective.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    density: float = 1.0  # fraction of elements sent
    fp16: bool = False  # values as 16-bit
    dense: bool = True  # dense allreduce (else sparse all_gather of values+indices)
    prune: float = 0.0  # fraction of smallest-|weight| entries zeroed first
    rank: int = 0  # > 0: low-rank (PowerSGD at this rank) instead of TopK, when not dense
    pad: float = 0.0  # a further fraction of elements sent as zeros (a padded probe: wire, no gradient)


@dataclass(frozen=True)
class StepMeasurement:
    """One step, as agreed by all ranks."""

    wire_bytes: float  # per rank
    payload_bytes: float  # compressed payload per rank (values+indices, or dense)
    comm_seconds: float  # busy time of the step's collectives
    compute_seconds: float  # step time minus exposed communication
    grad_norm: float  # L2 norm of the (uncompressed) gradient
    selection_seconds: float = 0.0  # the compressor's own work (selecting, packing, decoding; PowerSGD's passes)
    elements_sent: float = 0.0  # gradient elements selected (sparse path)


def smoothed(average: float, sample: float, weight: float = 0.3) -> float:
    """Exponential moving average; the first sample (average still 0) is taken as it is. Compute times are
    noisy on shared CPUs."""
    return sample if average == 0 else (1 - weight) * average + weight * sample


class Policy:
    measures = True  # reads each step's agreed measurement (False: the ranks need not agree on one each step)

    def update(self, m: StepMeasurement) -> None:  # pragma: no cover - interface
        """A step this policy decided has been measured."""
        raise NotImplementedError

    def sense(self, m: StepMeasurement) -> None:
        """A step the policy did not decide (the dense warm-up) has been measured: what it says about the
        link and the task counts; only a policy that reacts to its own decisions needs to tell them apart."""
        self.update(m)

    def decide(self) -> Decision:  # pragma: no cover - interface
        raise NotImplementedError

    def estimates(self) -> dict:
        return {}
