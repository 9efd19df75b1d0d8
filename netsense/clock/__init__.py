"""What a step costs in time, behind one interface: the real clock (the emulated or a real link, read with
``time.perf_counter``) or a modeled one (``netsense.clock.simulated``: the same training and collectives over
loopback, each step's time from a model). The trainer's training clock, the profile's time axis, the hooks'
step records (and so sensing and every controller) read time only through a ``Clock``, so the two clocks
differ in nothing else.

A hook state asks its clock for each step's collective timer (``timer``) and, when the step ends, for what the
step cost (``settle``): the collectives' busy time, the step's compute and the compressor's own work."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # netsense.compression imports this module: the timer's module is imported when a step asks
    import torch

    from netsense.compression.steps import StepCounts
    from netsense.compression.timing import IntervalTimer


@dataclass(frozen=True)
class StepCost:
    """What one step cost: its collectives' busy time (the union of their intervals), its compute (the step
    less its wait for the network and less the compressor's work), and that work (selection, packing,
    decoding)."""

    comm_seconds: float
    compute_seconds: float
    selection_seconds: float


class RealClock:
    """Time as it passes: a step costs what it took."""

    simulated = False

    def now(self) -> float:
        """Seconds on a monotonic clock (the training clock's source)."""
        return time.perf_counter()

    def wall(self) -> float:
        """Unix time, which ranks and shapers share (the profile's epoch)."""
        return time.time()

    def timer(self, device: torch.device) -> IntervalTimer:
        from netsense.compression.timing import IntervalTimer

        return IntervalTimer(device)

    def settle(self, step_start: float, timer: IntervalTimer, selection_timer: IntervalTimer,
               counts: StepCounts) -> StepCost:
        busy = timer.busy()
        selection = selection_timer.busy()
        compute = max(1e-6, (time.perf_counter() - step_start) - timer.exposed() - selection)
        return StepCost(busy, compute, selection)


REAL = RealClock()
