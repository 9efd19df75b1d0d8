"""The profile runs on the training clock (netsense.shaping.shaper): the follower applies each step of a
bandwidth profile when that clock reaches it; the trainer starts the clock when training starts and stops it
while it evaluates (Trainer.start_profile_clock, _stop_clock, _restart_clock: the clock file); a pause shifts
every later step by its length. Here on a clock the test moves (no sleeping, no real time) and links that only
record the rates they were given: no tc, no root."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from netsense.shaping import shaper
from netsense.shaping.profiles import build_profile
from netsense.shaping.shaper import ProfileFollower, clock_now
from netsense.spec import parse_spec
from netsense.train import trainer as trainer_module
from netsense.train.trainer import Trainer

START = 1000.0  # the unix time the test's clock starts at
PROFILE = {"type": "steps", "steps": [{"at": "0s", "rate": "100Mbit"}, {"at": "1s", "rate": "50Mbit"},
                                      {"at": "2.5s", "rate": "200Mbit"}]}


class Clock:
    """time.time and time.monotonic as the test sets them."""

    def __init__(self) -> None:
        self.now = START

    def time(self) -> float:
        return self.now

    monotonic = time


class Link:
    """A shaped link that records (the clock's time, the rate) of each rate it is given."""

    netns, shaped_dev, burst = None, "eth0", 0  # no bucket installed: a change never waits for one to shrink

    def __init__(self, clock: Clock) -> None:
        self.clock, self.rates = clock, []

    def setup(self, bps: float) -> None:
        self.rates.append((self.clock.now, bps))

    def change(self, bps: float, burst: int | None = None) -> None:
        self.rates.append((self.clock.now, bps))

    def teardown(self) -> None:
        pass


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(shaper, "time", c)
    monkeypatch.setattr(trainer_module, "time", c)  # the trainer's clock writes
    return c


def follow(follower: ProfileFollower, clock: Clock, until: float,
           events: list[tuple[float, Callable[[], None]]] = ()) -> None:
    """Run the follower's loop until the clock reads ``until``: each wait moves the clock on by what the
    follower asked to wait, and whatever ``events`` fall inside it happen at their own times (the follower sees
    them when it wakes, as it would)."""
    pending = sorted(events, key=lambda e: e[0])

    def wait(seconds: float | None) -> bool:
        wake = min(until, until if seconds is None else clock.now + max(0.0, seconds))
        while pending and pending[0][0] <= wake:
            at, event = pending.pop(0)
            clock.now = max(clock.now, at)
            event()
        clock.now = wake
        if clock.now >= until:
            follower.stop_event.set()
        return follower.stop_event.is_set()

    follower._wait = wait
    follower.start_shaping()
    follower.follow()


def _changes(link: Link) -> list[tuple[float, float]]:
    return [(round(t - START, 3), bps / 1e6) for t, bps in link.rates]


def test_the_follower_applies_each_step_of_the_profile_at_its_time(clock: Clock):
    link = Link(clock)
    follower = ProfileFollower(build_profile(PROFILE), [link], epoch=START, log=None)
    follow(follower, clock, START + 10)
    assert _changes(link) == [(0.0, 100.0), (1.0, 50.0), (2.5, 200.0)]


def test_a_looped_trace_applies_its_steps_again_each_period(clock: Clock):
    trace = {"type": "trace", "loop": True, "points": [{"at": "0s", "rate": "10Mbit"}, {"at": "2s", "rate": "20Mbit"}]}
    link = Link(clock)
    follow(ProfileFollower(build_profile(trace), [link], epoch=START, log=None), clock, START + 9)
    assert _changes(link) == [(0.0, 10.0), (2.0, 20.0), (4.0, 10.0), (6.0, 20.0), (8.0, 10.0)]  # period 4 s


def test_the_profile_waits_for_the_trainers_clock_and_an_evaluation_shifts_every_later_step(clock: Clock,
                                                                                            tmp_path, monkeypatch):
    """The workers start 5 s after the shaper: the first step holds until the trainer publishes its clock. At
    0.5 s of training it evaluates for 3 s: the profile stands still, so its 1 s step comes 3 s later on the
    wall clock, at 1 s of training, and so does every step after it."""
    start_file = str(tmp_path / "start")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # not this test process's threads
    job = parse_spec({"workers": 1, "training": {"model": "mlp", "dataset": "digits", "maxSteps": 10},
                      "network": {"profile": PROFILE}}, "clocked")
    trainer = Trainer(job, 0, 1, start_file=start_file)
    monkeypatch.setattr(trainer_module, "emit", lambda *args, **kwargs: None)

    def evaluate() -> None:
        trainer.state.train_time = 0.5
        trainer._stop_clock()

    link = Link(clock)
    follower = ProfileFollower(build_profile(PROFILE), [link], log=None, start_file=start_file)
    follow(follower, clock, START + 20, [(START + 5, trainer.start_profile_clock), (START + 5.5, evaluate),
                                         (START + 8.5, trainer._restart_clock)])
    # Read every 20 ms (shaper.CLOCK_POLL_S): each change within one read of its time.
    expected = [(0.0, 100.0), (9.0, 50.0), (10.5, 200.0)]
    assert [bps for _, bps in _changes(link)] == [bps for _, bps in expected]
    for (t, _), (want, _) in zip(_changes(link), expected, strict=True):
        assert want <= t <= want + shaper.CLOCK_POLL_S + 1e-3, _changes(link)
    # The trainer's own record of the link: the rate in force at its training time.
    trainer.state.train_time = 1.2
    assert trainer.link_rate_mbit() == 50.0


def test_the_trainers_clock_stands_still_while_it_evaluates_and_runs_on_from_there(clock: Clock, tmp_path,
                                                                                    monkeypatch):
    start_file = str(tmp_path / "start")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(trainer_module, "emit", lambda *args, **kwargs: None)
    job = parse_spec({"workers": 1, "training": {"model": "mlp", "dataset": "digits", "maxSteps": 10}}, "clocked")
    trainer = Trainer(job, 0, 1, start_file=start_file)
    assert clock_now(start_file) is None  # before training starts: no clock, the first step holds
    trainer.start_profile_clock()
    clock.now += 2.0
    assert clock_now(start_file) == 2.0
    trainer.state = SimpleNamespace(train_time=2.0)
    trainer._stop_clock()
    clock.now += 30.0  # a long evaluation
    assert clock_now(start_file) == 2.0
    trainer._restart_clock()
    assert clock_now(start_file) == 2.0
    clock.now += 0.25
    assert clock_now(start_file) == 2.25
