"""Timing collectives by their real completion, on CPU and GPU.

The hook starts a timer when it launches a collective and stops it in the
future's completion callback. On CPU (gloo) wall clock in the callback is real
completion. On GPU (NCCL) the callback only means the work is *enqueued* on the
stream, so we record CUDA events on the current stream instead and read them
when the step is finalized (after DDP has waited for every bucket) -- never CPU
time around an unsynchronised GPU call.
"""

from __future__ import annotations

import time

import torch


class IntervalTimer:
    """Collects [start, end] intervals of one step; busy() is their union's length."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._ref = None
        self._open: list = []
        self._intervals: list[tuple[float, float]] = []
        self.last_launch = 0.0
        self.last_done = 0.0
        self.waited = 0.0  # host seconds blocked on collectives (wait_for)

    def _now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            if self._ref is None:
                self._ref = ev
            return ev
        return time.perf_counter()

    def start(self, kind: str = "all_reduce", wire_bytes: float = 0.0):
        """A collective launched: ``kind`` (all_reduce, all_gather) and the bytes this rank puts on the wire
        are what a modeled clock prices it by (netsense.clock.simulated); the real clock reads its time."""
        self.last_launch = time.perf_counter()
        return self._now()

    def carried(self, kind: str, wire_bytes: float) -> None:
        """A collective launched before this step began (MeasuredState.carry): its real time shows in the step's
        wait where it delays the step, and is not a collective of the step's own (not timed here)."""

    def stop(self, token) -> None:
        self.last_done = time.perf_counter()
        self._open.append((token, self._now()))

    def wait_for(self, run, kind: str = "all_reduce", wire_bytes: float = 0.0) -> None:
        """Run a collective the host blocks on (``run()`` returns when it has completed): its interval is busy,
        and all of it is exposed, the step waited for it. PowerSGD's first all_reduce is one (its Q's need the
        summed P's): timed as a launch it moved the last launch and its wait read as compute, 21.6 ms a
        PowerSGD step against 11.1 ms a TopK step of the same runs (dev-batch-set2)."""
        since = time.perf_counter()
        token = self._now()
        run()
        self._open.append((token, self._now()))
        self.waited += time.perf_counter() - since

    def _resolve(self, mark) -> float:
        if not self.cuda:
            return mark
        mark.synchronize()
        return self._ref.elapsed_time(mark) / 1e3

    def busy(self) -> float:
        """Union of intervals in seconds; resets for the next step."""
        intervals = sorted((self._resolve(a), self._resolve(b)) for a, b in self._open)
        self._open.clear()
        self._ref = None
        total, cur_start, cur_end = 0.0, None, None
        for a, b in intervals:
            if cur_end is None or a > cur_end:
                if cur_end is not None:
                    total += cur_end - cur_start
                cur_start, cur_end = a, b
            else:
                cur_end = max(cur_end, b)
        if cur_end is not None:
            total += cur_end - cur_start
        return total

    def exposed(self) -> float:
        """How long the step waited for communication: after its last launch, and blocked on any (wait_for)."""
        return self.waited + max(0.0, self.last_done - self.last_launch)
