"""Follow a bandwidth profile over time on one or more links.

Used by the local testbed (a thread, all hosts' links at once) and by
``netsense shape`` (the Kubernetes sidecar: one pod's eth0, egress and optionally
ingress). The profile's clock starts at ``epoch`` (a unix time): the operator
gives every pod of a job the same epoch, so all links change together.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from netsense import units
from netsense.shaping.profiles import Profile
from netsense.shaping.tc import TcLink


class ProfileFollower:
    def __init__(
        self,
        profile: Profile,
        links: list[TcLink],
        epoch: float | None = None,
        log: TextIO | None = sys.stdout,
        on_change: Callable[[float, float], None] | None = None,
    ):
        self.profile = profile
        self.links = links
        self.epoch = time.time() if epoch is None else epoch
        self.log = log
        self.on_change = on_change
        self.stop_event = threading.Event()
        self.applied: list[tuple[float, float]] = []  # (unix time applied, bps)
        self._thread: threading.Thread | None = None

    def _emit(self, event: str, t: float, bps: float) -> None:
        self.applied.append((time.time(), bps))
        if self.on_change:
            self.on_change(t, bps)
        if self.log:
            line = {"event": event, "t": round(t, 3), "step": self.profile.index_at(t),
                    "rate": units.format_rate(bps), "rate_bps": bps,
                    "devs": [link.shaped_dev for link in self.links], "time": round(time.time(), 3)}
            print(json.dumps(line), file=self.log, flush=True)

    def start_shaping(self) -> None:
        """Apply the rate in force now on every link (before any traffic flows)."""
        t = max(0.0, time.time() - self.epoch)
        bps = self.profile.rate_at(t)
        for link in self.links:
            link.setup(bps)
        self._emit("shaped", t, bps)

    def follow(self) -> None:
        """Apply each change at its time until stop() (blocking)."""
        while not self.stop_event.is_set():
            t = time.time() - self.epoch
            nxt = self.profile.next_change(t)
            if nxt is None:
                self.stop_event.wait()
                return
            if self.stop_event.wait(max(0.0, nxt - t)):
                return
            bps = self.profile.rate_at(nxt + 1e-6)
            for link in self.links:
                link.change(bps)
            self._emit("rate", nxt, bps)

    def start(self) -> ProfileFollower:
        """start_shaping, then follow in a daemon thread."""
        self.start_shaping()
        self._thread = threading.Thread(target=self.follow, name="profile-follower", daemon=True)
        self._thread.start()
        return self

    def stop(self, teardown: bool = True) -> None:
        self.stop_event.set()
        if self._thread:
            self._thread.join(timeout=5)
        if teardown:
            for link in self.links:
                link.teardown()
