"""What every hook state measures per step.

A step begins at its first bucket (bucket 0, which DDP always launches first) or at ``start_step()``
before the forward pass, and ends at ``end_step()`` (the trainer calls it after the optimizer step;
otherwise the next step's first bucket does). Its record: what it decided, the bytes it sent, how long its
collectives were busy, its compute (the step minus the wait for the network, after its last launch and blocked
on any, and minus the compressor's own work: selecting, packing, decoding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from netsense.clock import REAL, RealClock
from netsense.compression.timing import IntervalTimer


@dataclass
class StepCounts:
    """One step's work, summed over its buckets."""

    wire_bytes: float = 0.0  # what this rank puts on the wire (the collective's algorithm counted)
    payload_bytes: float = 0.0  # what this rank's gradient was compressed to (before the collective)
    selection_seconds: float = 0.0  # a compressor's own work: TopK's selecting, packing and decoding, PowerSGD's
    grad_sq: float | torch.Tensor = 0.0  # squared gradient norm: a tensor until the step ends (no sync)
    elements_sent: float = 0.0  # gradient elements sent (all of them when dense)
    elements_total: float = 0.0
    sparse_elements: float = 0.0  # the elements of the buckets TopK's path took (selected, packed, decoded)
    lowrank_elements: float = 0.0  # ... and PowerSGD's (projected, orthogonalized, applied)


class MeasuredState:
    """A hook state that measures its steps (``history``: one record per finished step).

    Subclasses say what their step decided (``_decision_fields``), may add to the record
    (``_extra_fields``) and act when a step ends (``_ended``) or begins (``_beginning``).
    """

    def __init__(self, process_group: dist.ProcessGroup | None = None):
        self.clock: RealClock = REAL  # what a step costs in time (register's clock: netsense.clock)
        self.group = process_group
        self.world = dist.get_world_size(process_group)
        self.step = -1
        self.counts = StepCounts()
        self.timer: IntervalTimer | None = None  # the collectives
        self.selection_timer: IntervalTimer | None = None  # selecting and packing: CUDA events on a GPU, where
        # the host's clock would count the backward kernels a synchronizing call (nonzero) waits for
        self.history: list[dict] = []
        self.device = torch.device("cpu")
        self._step_start = 0.0
        self._forward_start: float | None = None
        self._finished = True
        self._carried: list[tuple[str, float]] = []  # collectives launched between steps: the next one pays them

    def carry(self, kind: str, wire_bytes: float) -> None:
        """A collective launched after the step ended (the measurement's agreement), which runs beside the next
        step's forward pass and which its first bucket waits for: the modeled clock prices it in that step."""
        self._carried.append((kind, wire_bytes))

    def optimizer_terms(self, momentum: float, weight_decay: float) -> tuple[float, float]:
        """The (momentum, weight decay) the SGD optimizer should apply (a hook that applies them says none)."""
        return momentum, weight_decay

    def start_step(self) -> None:
        """Mark the start of a step's forward pass (call before it).

        The compute a step costs starts there; without this mark it is timed from the first bucket's hook,
        which misses the forward pass and part of the backward."""
        self.end_step()
        self._forward_start = self.clock.now()

    def end_step(self) -> dict | None:
        """Finalize the open step's record and return it (None if no step is open; idempotent)."""
        if self._finished or self.timer is None:
            return None
        self._finished = True
        c = self.counts
        cost = self.clock.settle(self._step_start, self.timer, self.selection_timer, c)
        busy, compute = cost.comm_seconds, cost.compute_seconds
        c.selection_seconds += cost.selection_seconds
        record = {
            "step": self.step,
            "density": c.elements_sent / c.elements_total if c.elements_total else 1.0,
            **self._decision_fields(),
            "wire_bytes": c.wire_bytes,
            "payload_bytes": c.payload_bytes,
            "comm_seconds": busy,
            "compute_seconds": compute,
            "selection_seconds": c.selection_seconds,
            "elements_sent": c.elements_sent,
            "grad_norm": math.sqrt(float(c.grad_sq)),
        }
        record.update(self._extra_fields(record))
        self.history.append(record)
        self._ended(record)
        return record

    def finish(self) -> None:
        """End the last step. Call before destroying the process group."""
        self.end_step()

    def begin_step(self, device: torch.device) -> None:
        """Called by the hook at a step's first bucket."""
        self.end_step()
        self._beginning()
        self.step += 1
        self.device = device
        self.counts = StepCounts()
        self.timer = self.clock.timer(device)
        for kind, wire_bytes in self._carried:
            self.timer.carried(kind, wire_bytes)
        self._carried = []
        self.selection_timer = self.clock.timer(device)
        self._step_start = self._forward_start if self._forward_start is not None else self.clock.now()
        self._forward_start = None
        self._finished = False

    def _decision_fields(self) -> dict:
        """fp16, dense, warmup: what the step decided."""
        raise NotImplementedError

    def _extra_fields(self, record: dict) -> dict:
        return {}

    def _ended(self, record: dict) -> None:
        pass

    def _beginning(self) -> None:
        pass
