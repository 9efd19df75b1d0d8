"""NetSenseML as published (Algorithms 1 and 2), every constant a parameter.

Sensing: BtlBw = windowed max of bytes/RTT, RTprop = windowed min of RTT,
BDP = BtlBw*RTprop, with bytes = what a step's collectives put on the wire
(the compressed payload, times N-1 for an all_gather: at 2 workers the
paper's data_size exactly) and RTT their busy time. BtlBw skips the samples
too small to measure the link, as BBR's does (control.sensing): the paper's
literal max of every payload/RTT reads a fraction of a faithful link.
Update::

    payload > fraction * BDP  ->  ratio *= alpha      (multiplicative decrease)
    otherwise                 ->  ratio += beta       (additive increase)

Start-up (the paper mentions one without detail): the ratio doubles each step
until the first decrease, like BBR's/TCP's slow start. A dense warm-up
step (warmupSteps, none by default) is sensed, not reacted to: its payload is the
BDP it measured, and taking it as a decision ended the start-up at once.
Reduction: fp16 values when ratio < trq and the gradient's L2 norm > trd,
which halves the bytes per value and so doubles the ratio; pruning of the
smallest-|weight| entries at prune_factor * (1 - ratio); TopK at the ratio.

trq = 0.1: below 10% density an element costs 4 bytes of index plus its
value, so fp16 values cut the payload by a third where compression is
heavy, and above it the precision is worth more than the bytes.
trd = 1e-3: below that norm many entries would flush to zero in fp16.
"""

from __future__ import annotations

from netsense.control.decision import Decision, Policy, StepMeasurement
from netsense.control.sensing import LinkEstimator


class PaperAIMD(Policy):
    """NetSenseML as published (Algorithms 1 and 2), every constant a parameter: the module's docstring."""

    def __init__(self, alpha=0.5, beta=0.01, fraction=0.9, initial=0.01, min_ratio=0.001,
                 max_ratio=1.0, startup=True, window=10, quantize=True, trq=0.1, trd=1e-3,
                 prune_factor=0.5):
        self.alpha, self.beta, self.fraction = alpha, beta, fraction
        self.min_ratio, self.max_ratio = min_ratio, max_ratio
        self.ratio = initial
        self.in_startup = startup
        self.quantize, self.trq, self.trd = quantize, trq, trd
        self.prune_factor = prune_factor
        self.sensor = LinkEstimator(window)
        self.grad_norm = 0.0

    def sense(self, m: StepMeasurement) -> None:
        """The dense warm-up step feeds the filters but is not a payload the AIMD chose: reacting to it
        (a dense payload equals the BDP it measured itself) ended the start-up before it began."""
        self.grad_norm = m.grad_norm
        self.sensor.observe(m.wire_bytes, m.comm_seconds)

    def update(self, m: StepMeasurement) -> None:
        self.sense(m)
        if m.wire_bytes <= 0:
            return
        if m.wire_bytes > self.fraction * self.sensor.bdp:
            self.ratio *= self.alpha
            self.in_startup = False
        elif self.in_startup:
            self.ratio *= 2
        else:
            self.ratio += self.beta
        self.ratio = min(self.max_ratio, max(self.min_ratio, self.ratio))

    def decide(self) -> Decision:
        fp16 = self.quantize and self.ratio < self.trq and self.grad_norm > self.trd
        density = min(1.0, self.ratio * 2 if fp16 else self.ratio)
        return Decision(density=density, fp16=fp16, dense=False,
                        prune=self.prune_factor * (1 - self.ratio))

    def estimates(self) -> dict:
        return {"payload_ratio": self.ratio, "est_btlbw_bytes_per_s": self.sensor.bandwidth, "est_rtprop_s": self.sensor.rtt}
