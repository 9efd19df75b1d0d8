"""Follow a bandwidth profile over time on one or more links.

Used by the emulated cluster (a thread, all hosts' links at once) and by
``netsense shape`` (the Kubernetes sidecar: one pod's eth0, egress and optionally
ingress).

The profile runs on the *training clock*, the clock on which time to accuracy
is measured: it starts at the first training step and stands still while the
trainer evaluates or agrees to stop. Given ``epoch`` (a unix time) the clock is
plain wall time from there. Given a ``start_file``, the trainer publishes its
clock there (``write_clock``): until the file appears the first step holds;
then it holds ``EPOCH`` while training runs (clock = now - EPOCH) or ``EPOCH
PAUSED_AT`` while the clock stands at PAUSED_AT. The follower reads it every
20 ms. The trainers agree on the epoch (rank 0's, broadcast to all ranks) and
each writes it for its own shaper, so every link changes together and every
run sees the same part of a time-varying profile however long its workers took
to start (3-9 s here, minutes for a cold image pull in a cluster) and however
long its evaluations take.

A link whose rate changes must never be left holding a packet larger than its
bucket (netsense.shaping.tc): the follower keeps the senders' GSO packets to the
rate in force (``GsoCap``) and lets a shrinking bucket settle (``Shrink``),
watching the queue over netlink every 10 ms until it has.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from netsense import units
from netsense.shaping.netlink import QdiscReader
from netsense.shaping.profiles import Profile
from netsense.shaping.tc import MTU_FRAME, GsoCap, TcLink, gso_segs_for, tbf_params

CLOCK_POLL_S = 0.02  # how often a follower reads the trainer's clock file
SETTLE_POLL_S = 0.01  # how often it reads a settling link's queue


def read_clock(path: str) -> tuple[float, float | None] | None:
    """(epoch, paused_at) from a clock file; None while it is absent or unreadable."""
    try:
        with open(path) as fh:
            fields = [float(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return None
    if len(fields) == 1:
        return fields[0], None
    return (fields[0], fields[1]) if len(fields) == 2 else None


def clock_seconds(epoch: float | None, paused_at: float | None = None) -> float | None:
    """Seconds on a clock running since ``epoch``, or standing at ``paused_at`` (None before it starts)."""
    if epoch is None:
        return None
    return paused_at if paused_at is not None else max(0.0, time.time() - epoch)


def clock_now(path: str) -> float | None:
    """Seconds on the training clock published at ``path`` (None before it starts)."""
    clock = read_clock(path)
    return None if clock is None else clock_seconds(*clock)


def write_clock(path: str, epoch: float, paused_at: float | None = None) -> None:
    """Publish the training clock: running since ``epoch``, or standing at ``paused_at``.

    Atomic (a reader never sees half a line)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(f"{epoch!r}\n" if paused_at is None else f"{epoch!r} {paused_at!r}\n")
    os.replace(tmp, path)


@dataclass
class Shrink:
    """A link's bucket shrinking while its queue may hold packets too large for the new one.

    TBF can never send a packet larger than its bucket, and packets queued whole
    under the old bucket may be (netsense.shaping.tc). So the link runs at the new
    rate with the old bucket (*loose*) until every byte queued when the phase
    began has left (FIFO: bytes sent since then reach the backlog read then),
    and only then gets its own bucket. Until what was queued at that moment has
    left too (*watch*), a backlog whose head does not move for ``stall_s`` is a
    packet too large for it (a sender's packet built before its socket saw the
    smaller GSO size): loose again, and repeat. A queue that is not moving in the
    loose phase only waits: nothing in it is larger than the loose bucket.
    """

    rate_bps: float
    loose_burst: int  # the largest bucket installed since the queue last drained: every queued packet fits it
    stall_s: float
    phase: str = "loose"
    until: int | None = None  # sent bytes at which the queue read when the phase began has left
    moved: tuple[int, float] = (-1, 0.0)  # (sent bytes, monotonic time) when the head last moved

    def step(self, sent: int, backlog: int, now: float) -> str | None:
        """What the link needs now: 'tighten', 'loosen', 'done', or None (read again later)."""
        if self.until is None:
            self.until, self.moved = sent + backlog, (sent, now)
        if sent >= self.until:
            return "tighten" if self.phase == "loose" else "done"
        if sent != self.moved[0]:
            self.moved = (sent, now)
        elif self.phase == "watch" and now - self.moved[1] >= self.stall_s:
            return "loosen"
        return None

    def enter(self, phase: str) -> None:
        self.phase, self.until = phase, None


class ProfileFollower:
    def __init__(
        self,
        profile: Profile,
        links: list[TcLink],
        epoch: float | None = None,
        log: TextIO | None = sys.stdout,
        on_change: Callable[[float, float], None] | None = None,
        start_file: str | None = None,
        senders: list[tuple[str | None, str]] | None = None,
    ):
        """``senders``: (netns, device) of every sender whose traffic crosses the links; on a profile with
        more than one rate their GSO packets are kept to the rate in force (netsense.shaping.tc)."""
        if epoch is not None and start_file is not None:
            raise ValueError("give the profile's clock an epoch or a start file, not both")
        self.profile = profile
        self.links = links
        self.start_file = start_file
        # None until the clock starts (start_file): the first step holds meanwhile.
        self.epoch: float | None = time.time() if epoch is None and start_file is None else epoch
        self.paused_at: float | None = None  # the training clock stands here (evaluation)
        self.index = 0  # the profile step the links carry
        self.log = log
        self.on_change = on_change
        self.stop_event = threading.Event()
        self._wake = threading.Event()  # set by stop() and rewind() to interrupt any wait
        self._rewind = False
        self.applied: list[tuple[float, float]] = []  # (unix time applied, bps)
        self._thread: threading.Thread | None = None
        varies = len({rate for _, rate in profile.points}) > 1
        self.gso = GsoCap(senders) if senders and varies else None
        self.shrinking: dict[int, Shrink] = {}  # by index into links
        self._readers: dict[str | None, QdiscReader] = {}  # opened in the follower's thread, one per netns

    def now(self) -> float:
        """Seconds on the profile's clock (0 until it starts)."""
        t = clock_seconds(self.epoch, self.paused_at)
        return 0.0 if t is None else t

    def _emit(self, event: str, t: float, bps: float, **extra) -> None:
        """A rate now in force on every link: recorded, told to on_change, logged."""
        self.applied.append((time.time(), bps))
        if self.on_change:
            self.on_change(t, bps)
        self._log(event, t, bps, **extra)

    def _log(self, event: str, t: float, bps: float, **extra) -> None:
        if self.log:
            line = {"event": event, "t": round(t, 3), "step": self.profile.index_at(t),
                    "rate": units.format_rate(bps), "rate_bps": bps,
                    "devs": [link.shaped_dev for link in self.links], "time": round(time.time(), 3), **extra}
            print(json.dumps(line), file=self.log, flush=True)

    def start_shaping(self) -> None:
        """Apply the rate in force now on every link (before any traffic flows)."""
        t = self.now()
        bps = self.profile.rate_at(t)
        self.index = self.profile.index_at(t)
        for link in self.links:
            link.setup(bps)
        if self.gso:
            self.gso.apply(bps)
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

    def _read_clock(self) -> None:
        """Take the trainer's clock from the start file (kept as it was while the file is absent)."""
        clock = read_clock(self.start_file)
        if clock is None:
            return
        started = self.epoch is None
        self.epoch, self.paused_at = clock
        if started:
            # The first step is what the links carry now; the loop catches up if the file came late.
            self._emit("clock", 0.0, self.profile.rate_at(0.0), epoch=self.epoch)

    def _apply(self, event: str, t: float) -> None:
        bps = self.profile.rate_at(t)
        self.index = self.profile.index_at(t)
        smaller_packets = self.gso is not None and gso_segs_for(bps) < (self.gso.segs or 0)
        if smaller_packets:  # before the buckets shrink: from now on senders build packets that fit them
            self.gso.apply(bps)
        for i, link in enumerate(self.links):
            self._change(i, link, bps)
        if self.gso and not smaller_packets:  # after the buckets grew
            self.gso.apply(bps)
        self._emit(event, t, bps)
        self._settle()

    def _change(self, i: int, link: TcLink, bps: float) -> None:
        """The new rate on one link; a bucket that shrinks starts loose (Shrink)."""
        pending = self.shrinking.pop(i, None)
        bound = max(link.burst, pending.loose_burst if pending else 0)
        if tbf_params(bps)["burst"] >= bound:
            link.change(bps)
            return
        imp = self.profile.impairments
        stall_s = max(0.02, 4 * MTU_FRAME * 8 / bps) + imp.delay_s + imp.jitter_s  # netem holds packets that long
        self.shrinking[i] = Shrink(bps, bound, stall_s)
        link.change(bps, burst=bound)

    def _settle(self) -> None:
        """Advance every shrinking bucket as far as its queue allows now."""
        for i in list(self.shrinking):
            link, shrink = self.links[i], self.shrinking[i]
            while True:
                stats = self._queue(link)
                if stats is None:  # the device is gone (teardown raced us): nothing left to protect
                    del self.shrinking[i]
                    break
                action = shrink.step(stats.sent_bytes, stats.backlog_bytes, time.monotonic())
                if action is None:
                    break
                if action == "done":
                    del self.shrinking[i]
                    break
                if action == "tighten":
                    link.change(shrink.rate_bps)
                    shrink.enter("watch")
                else:  # loosen: a packet too large for the bucket heads the queue
                    link.change(shrink.rate_bps, burst=shrink.loose_burst)
                    shrink.enter("loose")
                    self._log("stall", self.now(), shrink.rate_bps, dev=link.shaped_dev)

    def _queue(self, link: TcLink):
        reader = self._readers.get(link.netns)
        if reader is None:
            reader = self._readers[link.netns] = QdiscReader(link.netns)
        try:
            return reader.read(link.shaped_dev)
        except OSError:
            return None

    def follow(self) -> None:
        """Apply each change when the clock reaches it, until stop() (blocking)."""
        while not self.stop_event.is_set():
            if self._rewind:
                self._rewind = False
                self.epoch = self.paused_at = None
                self._apply("rewound", 0.0)
            if self.start_file is not None:
                self._read_clock()
            t = self.now()
            if self.profile.index_at(t) != self.index:
                self._apply("rate", t)
            self._settle()
            nxt = self.profile.next_change(t)
            wait = None if nxt is None else nxt - t + 1e-6
            if self.start_file is not None:  # the trainer may pause or start the clock at any time
                wait = CLOCK_POLL_S if wait is None else min(wait, CLOCK_POLL_S)
            if self.shrinking:
                wait = SETTLE_POLL_S if wait is None else min(wait, SETTLE_POLL_S)
            self._wait(wait)
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

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
            if self.gso:
                self.gso.restore()
