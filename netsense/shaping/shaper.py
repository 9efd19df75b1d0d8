"""Follow a bandwidth profile over time on one or more links.

Used by the local testbed (a thread, all hosts' links at once) and by
``netsense shape`` (the Kubernetes sidecar: one pod's eth0, egress and optionally
ingress).

The profile's clock starts at ``epoch`` (a unix time), or, given ``start_file``,
when training starts: until that file holds a unix time the first step stays in
force, then the clock runs from the time written there. The trainers agree on
that time (rank 0's, broadcast to all ranks) and each writes it for its own
shaper, so every link changes together and every run sees the same part of a
time-varying profile however long its workers took to start (3-9 s here,
minutes for a cold image pull in a cluster).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from netsense import units
from netsense.shaping.profiles import Profile
from netsense.shaping.tc import TcLink

START_POLL_S = 0.02  # how often a waiting follower looks for the start file


def read_start_file(path: str) -> float | None:
    """The unix time written to ``path``, or None while it is absent or incomplete."""
    try:
        with open(path) as fh:
            return float(fh.read().strip())
    except (OSError, ValueError):
        return None


def write_start_file(path: str, epoch: float) -> None:
    """Atomically (a reader never sees half a number)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(f"{epoch!r}\n")
    os.replace(tmp, path)


class ProfileFollower:
    def __init__(
        self,
        profile: Profile,
        links: list[TcLink],
        epoch: float | None = None,
        log: TextIO | None = sys.stdout,
        on_change: Callable[[float, float], None] | None = None,
        start_file: str | None = None,
    ):
        if epoch is not None and start_file is not None:
            raise ValueError("give the profile's clock an epoch or a start file, not both")
        self.profile = profile
        self.links = links
        self.start_file = start_file
        # None until the clock starts (start_file): the first step holds meanwhile.
        self.epoch: float | None = time.time() if epoch is None and start_file is None else epoch
        self.log = log
        self.on_change = on_change
        self.stop_event = threading.Event()
        self._wake = threading.Event()  # set by stop() and rewind() to interrupt any wait
        self._rewind = False
        self.applied: list[tuple[float, float]] = []  # (unix time applied, bps)
        self._thread: threading.Thread | None = None

    def now(self) -> float:
        """Seconds on the profile's clock (0 until it starts)."""
        return 0.0 if self.epoch is None else max(0.0, time.time() - self.epoch)

    def _emit(self, event: str, t: float, bps: float, **extra) -> None:
        self.applied.append((time.time(), bps))
        if self.on_change:
            self.on_change(t, bps)
        if self.log:
            line = {"event": event, "t": round(t, 3), "step": self.profile.index_at(t),
                    "rate": units.format_rate(bps), "rate_bps": bps,
                    "devs": [link.shaped_dev for link in self.links], "time": round(time.time(), 3), **extra}
            print(json.dumps(line), file=self.log, flush=True)

    def start_shaping(self) -> None:
        """Apply the rate in force now on every link (before any traffic flows)."""
        t = self.now()
        bps = self.profile.rate_at(t)
        for link in self.links:
            link.setup(bps)
        self._emit("shaped", t, bps)

    def _interrupted(self) -> bool:
        return self.stop_event.is_set() or self._rewind

    def _wait(self, seconds: float | None) -> bool:
        """Sleep up to ``seconds`` (None: until woken); True if stop() or rewind() cut it short."""
        if self._interrupted():
            return True
        self._wake.wait(None if seconds is None else max(0.0, seconds))
        self._wake.clear()
        return self._interrupted()

    def _await_start(self) -> bool:
        """Hold the first step until the start file names the epoch; False if interrupted."""
        while True:
            epoch = read_start_file(self.start_file)
            if epoch is not None:
                self.epoch = epoch
                # The first step is what the links carry now; follow() catches up if the file came late.
                self._emit("clock", 0.0, self.profile.rate_at(0.0), epoch=epoch)
                return True
            if self._wait(START_POLL_S):
                return False

    def _apply(self, event: str, t: float) -> None:
        bps = self.profile.rate_at(t)
        for link in self.links:
            link.change(bps)
        self._emit(event, t, bps)

    def follow(self) -> None:
        """Apply each change at its time until stop() (blocking)."""
        while not self.stop_event.is_set():
            if self._rewind:
                self._rewind = False
                self.epoch = None
                self._apply("rewound", 0.0)
            if self.epoch is None:
                if not self._await_start():
                    continue
                if self.profile.index_at(self.now()) != 0:
                    self._apply("rate", self.now())  # the file was read late: catch up
            while not self._interrupted():
                t = time.time() - self.epoch
                nxt = self.profile.next_change(t)
                if nxt is None:
                    self._wait(None)
                    break
                if self._wait(nxt - t):
                    break
                self._apply("rate", nxt + 1e-6)

    def rewind(self) -> None:
        """Back to the first step, waiting for the start file again (a gang restart).

        Remove the old start file first: the clock restarts at the time the new
        gang writes."""
        if self.start_file is None:
            raise ValueError("only a follower with a start file can be rewound")
        self._rewind = True
        self._wake.set()

    def start(self) -> ProfileFollower:
        """start_shaping, then follow in a daemon thread."""
        self.start_shaping()
        self._thread = threading.Thread(target=self.follow, name="profile-follower", daemon=True)
        self._thread.start()
        return self

    def stop(self, teardown: bool = True) -> None:
        self.stop_event.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=5)
        if teardown:
            for link in self.links:
                link.teardown()
