"""What a step's record says about time, on a clock the test drives (no sleeping, nothing to flake).

Every adaptive policy reads two numbers a step: how long its collectives were busy (``comm_seconds``: the
union of their [launch, completion] intervals, IntervalTimer.busy) and its compute, the step's time less the
wait for the network after the last launch (IntervalTimer.exposed) and less selection. Swapping busy and
exposed, or summing overlapping intervals, skews every density the policies choose."""

from __future__ import annotations

import types

import pytest
import torch
from support.clock import FakeClock

import netsense.clock as clock_module
from netsense.compression import steps, timing
from netsense.compression.timing import IntervalTimer


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    """The one clock both the timer and the step record read (their modules' ``time``, not the global one)."""
    c = FakeClock(0.0)
    fake = types.SimpleNamespace(perf_counter=c)
    monkeypatch.setattr(timing, "time", fake)
    monkeypatch.setattr(clock_module, "time", fake)
    return c


def _play(clock: FakeClock, timer: IntervalTimer, intervals: list[tuple[float, float]]) -> None:
    """Launch and complete collectives over these [launch, completion] intervals, in time order (at equal
    times a completion before a launch), as the hooks call the timer."""
    events = sorted([(a, 1, i) for i, (a, _) in enumerate(intervals)] + [(b, 0, i) for i, (_, b) in enumerate(intervals)])
    tokens = {}
    for t, is_launch, i in events:
        clock.at(t)
        if is_launch:
            tokens[i] = timer.start()
        else:
            timer.stop(tokens[i])


def _timer_with(clock: FakeClock, intervals: list[tuple[float, float]]) -> IntervalTimer:
    """A CPU timer that saw these intervals."""
    timer = IntervalTimer(torch.device("cpu"))
    _play(clock, timer, intervals)
    return timer


@pytest.mark.parametrize("intervals, busy", [
    ([], 0.0),
    ([(1.0, 2.5)], 1.5),
    ([(1.0, 3.0), (2.0, 4.0)], 3.0),  # overlapping: counted once
    ([(1.0, 5.0), (2.0, 3.0)], 4.0),  # nested: the inner adds nothing
    ([(1.0, 2.0), (3.0, 4.5)], 2.5),  # apart: the gap is not busy
    ([(1.0, 2.0), (2.0, 3.0), (6.0, 7.0), (6.5, 8.0)], 4.0),  # touching, then an overlapping pair
])
def test_busy_is_the_length_of_the_union_of_the_intervals(clock: FakeClock, intervals, busy: float):
    """comm_seconds, what the link estimators divide the wire bytes by: time some collective was in flight,
    each second once however many buckets overlap in it."""
    assert _timer_with(clock, intervals).busy() == pytest.approx(busy)


def test_busy_resets_for_the_next_step(clock: FakeClock):
    timer = _timer_with(clock, [(1.0, 2.0)])
    assert timer.busy() == pytest.approx(1.0)
    assert timer.busy() == 0.0


@pytest.mark.parametrize("intervals, exposed", [
    ([], 0.0),
    ([(1.0, 2.5)], 1.5),
    ([(1.0, 4.0), (2.0, 3.0)], 2.0),  # the last launch at 2, the last completion at 4 (the earlier bucket's)
    ([(1.0, 1.5), (3.0, 3.25)], 0.25),  # the first bucket finished under the backward pass: not waited for
])
def test_exposed_is_the_wait_from_the_last_launch_to_the_last_completion(clock: FakeClock, intervals, exposed: float):
    """The communication the step could not hide behind the backward pass: after its last bucket was launched,
    the time until every collective had completed."""
    assert _timer_with(clock, intervals).exposed() == pytest.approx(exposed)


class _Measured(steps.MeasuredState):
    def _decision_fields(self) -> dict:
        return {"fp16": False, "dense": True, "warmup": False}


@pytest.fixture
def measured(monkeypatch) -> _Measured:
    """A MeasuredState of a one-rank world without a process group (only its size is asked)."""
    monkeypatch.setattr(steps, "dist", types.SimpleNamespace(get_world_size=lambda group=None: 1))
    return _Measured()


def _step(state: _Measured, clock: FakeClock, forward_at: float | None, first_bucket_at: float,
          intervals: list[tuple[float, float]], selection: float, end_at: float) -> dict:
    """One step: the forward pass marked at ``forward_at`` (None: not marked), the first bucket's hook at
    ``first_bucket_at``, collectives over ``intervals``, ``selection`` seconds of selection (timed by the state's
    selection timer from the first bucket on, as the hooks do); ends at ``end_at``."""
    if forward_at is not None:
        clock.at(forward_at)
        state.start_step()
    clock.at(first_bucket_at)
    state.begin_step(torch.device("cpu"))
    _play(clock, state.timer, intervals)
    _play(clock, state.selection_timer, [(first_bucket_at, first_bucket_at + selection)] if selection else [])
    clock.at(end_at)
    return state.end_step()


def test_compute_is_the_step_less_the_exposed_wait_and_the_selection(clock: FakeClock, measured: _Measured):
    """Step from 0 (forward marked) to 10. Two buckets: launched at 4 and 6, done at 7 and 8: busy 4 s
    ([4, 8]), exposed 2 s (from the last launch at 6 to 8). Selection 0.5 s. Compute = 10 - 2 - 0.5 = 7.5;
    with busy in place of exposed it would read 5.5, and the policies would see a network twice as costly."""
    record = _step(measured, clock, 0.0, 3.0, [(4.0, 7.0), (6.0, 8.0)], 0.5, 10.0)
    assert record["comm_seconds"] == pytest.approx(4.0)
    assert record["compute_seconds"] == pytest.approx(7.5)
    assert record["selection_seconds"] == pytest.approx(0.5)


def test_a_collective_the_host_blocks_on_is_exposed_whole_not_compute(clock: FakeClock, measured: _Measured):
    """PowerSGD's P's all_reduce is waited for inside the backward pass (its Q's need the sum): all of it is the
    step waiting for the network. Step 0 to 10; the blocking collective from 4 to 6, the Q's launched at 7 and done
    at 9; selection 0.5 s: exposed 2 + 2, compute 10 - 4 - 0.5 = 5.5. Timed as a launch, the blocking one's wait
    read as compute (7.5 here; on set 2's MLP 21.6 ms a PowerSGD step against a TopK step's 11.1 ms)."""
    clock.at(0.0)
    measured.start_step()
    clock.at(3.0)
    measured.begin_step(torch.device("cpu"))
    clock.at(4.0)
    measured.timer.wait_for(lambda: clock.at(6.0))
    _play(clock, measured.timer, [(7.0, 9.0)])
    _play(clock, measured.selection_timer, [(3.0, 3.5)])
    clock.at(10.0)
    record = measured.end_step()
    assert record["comm_seconds"] == pytest.approx(4.0)
    assert record["compute_seconds"] == pytest.approx(5.5)


def test_without_the_forward_mark_the_step_is_timed_from_its_first_bucket(clock: FakeClock, measured: _Measured):
    """A trainer that does not call start_step(): the step counts from the first bucket's hook (3 s here)."""
    record = _step(measured, clock, None, 3.0, [(4.0, 5.0)], 0.0, 10.0)
    assert record["compute_seconds"] == pytest.approx(10.0 - 3.0 - 1.0)
    assert record["comm_seconds"] == pytest.approx(1.0)


def test_each_step_is_timed_on_its_own(clock: FakeClock, measured: _Measured):
    """The second step's record knows nothing of the first's intervals (a new timer per step), and starts
    at its own forward mark."""
    _step(measured, clock, 0.0, 1.0, [(2.0, 9.0)], 0.0, 10.0)
    record = _step(measured, clock, 10.0, 11.0, [(12.0, 13.0)], 0.25, 20.0)
    assert record["step"] == 1
    assert record["comm_seconds"] == pytest.approx(1.0)
    assert record["compute_seconds"] == pytest.approx(10.0 - 1.0 - 0.25)
