"""The shaper's queue, made visible: backlog, drops and queueing delay of a root qdisc.

Read over rtnetlink (netsense.shaping.netlink), the numbers ``tc -s qdisc show``
prints, at ~100 samples a second: a fork of ``tc`` per sample would cost more
CPU than the two cores here can spare beside a training job (one sampler costs
~5% of a core while its links carry traffic). One sampler opens one netlink
socket per namespace and reads every shaped link of an emulated run; the
shaping sidecar reads its own pod's.

    python -m netsense.shaping.queue --dev [LABEL=][NETNS:]DEV ... [--clock FILE] [--every 0.01] --out queue.csv

Each row: the training clock (``--clock``: the file the trainer publishes, see
netsense.shaping.shaper; empty before the clock starts), the device, the
backlog in bytes and packets, the queueing delay it means at the current rate
(backlog / rate: the time the last byte in the queue waits), cumulative drops
and bytes sent. A row is written when the backlog or the counters changed, and
once a second otherwise, so an idle link costs little disk. The summary
(``--summary``) is kept online over the training clock: queueing-delay
percentiles weighted by how long each delay held, the worst, and the drops.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from netsense.shaping.netlink import QdiscReader
from netsense.shaping.shaper import clock_now

FIELDS = ["t", "dev", "backlog_bytes", "backlog_packets", "queue_delay_ms", "drops", "sent_bytes", "rate_mbit"]


def write_shared(path: str, text: str) -> None:
    """Replace ``path`` atomically, in a directory another, less privileged container may write too (the
    trainer's and the shaper's shared volume): a link planted at the temporary name is removed, never
    followed (O_NOFOLLOW | O_EXCL), so a root shaper writes nowhere but here."""
    tmp = f"{path}.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


@dataclass(frozen=True)
class Link:
    """A shaped device to sample: its label in the CSV, and where it lives."""

    label: str
    dev: str
    netns: str | None = None  # a named namespace (ip netns); None: this process's

    @classmethod
    def parse(cls, text: str) -> Link:
        """DEV, NETNS:DEV or LABEL=NETNS:DEV (the label defaults to DEV)."""
        label, _, where = text.rpartition("=")
        netns, _, dev = where.rpartition(":")
        return cls(label or dev, dev, netns or None)


class DelayHistogram:
    """Queueing delays weighted by how long each held, in log-spaced bins 2% wide (1 us to minutes), so a
    run of hours summarizes in a few kB: percentiles come out within 2% (the bin's upper edge)."""

    FLOOR_MS, GROWTH = 0.001, 1.02

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}  # bin -> seconds held; bin -1: below the floor (an empty queue)
        self.worst = 0.0

    def add(self, delay_ms: float, seconds: float) -> None:
        self.worst = max(self.worst, delay_ms)
        b = -1 if delay_ms < self.FLOOR_MS else int(math.log(delay_ms / self.FLOOR_MS, self.GROWTH))
        self.seconds[b] = self.seconds.get(b, 0.0) + seconds

    def percentile(self, q: float) -> float:
        total = sum(self.seconds.values())
        seen = 0.0
        for b in sorted(self.seconds):
            seen += self.seconds[b]
            if seen >= q * total:
                return 0.0 if b < 0 else min(self.worst, self.FLOOR_MS * self.GROWTH ** (b + 1))
        return self.worst


@dataclass
class LinkStats:
    """One link's queue over the training clock: the delay histogram, drops, seconds covered."""

    delays: DelayHistogram
    first_drops: int
    drops: int = 0
    seconds: float = 0.0
    t: float | None = None  # training clock at the last sample
    delay_ms: float = 0.0  # the delay seen at the last sample: it holds until the next

    def add(self, t: float | None, delay_ms: float | None, drops: int) -> None:
        if t is not None and self.t is not None and t > self.t:
            self.delays.add(self.delay_ms, t - self.t)
            self.seconds += t - self.t
        self.t, self.delay_ms, self.drops = t, delay_ms or 0.0, drops

    def summary(self) -> dict:
        d = self.delays
        return {"queue_delay_p50_ms": round(d.percentile(0.5), 3), "queue_delay_p99_ms": round(d.percentile(0.99), 3),
                "queue_delay_max_ms": round(d.worst, 3), "drops": self.drops - self.first_drops,
                "seconds": round(self.seconds, 3)}


class Sampler:
    """Samples links every ``every_s`` until stop(): rows into ``csv_path`` (optional: the emulated cluster keeps them
    for its plots and per-step columns) and the summary into ``summary_path`` every few seconds and at the
    end (small: what a sidecar leaves in the pod's shared emptyDir for the trainer)."""

    SUMMARY_EVERY_S = 5.0

    def __init__(self, links: list[Link], clock: str | None, csv_path: str | None = None,
                 summary_path: str | None = None, every_s: float = 0.01):
        self.links, self.clock, self.csv_path, self.summary_path = links, clock, csv_path, summary_path
        self.every_s = every_s
        self.stats: dict[Link, LinkStats] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def summary(self) -> dict[str, dict]:
        return {link.label: st.summary() for link, st in self.stats.items()}

    def _write_summary(self) -> None:
        if self.summary_path:
            write_shared(self.summary_path, json.dumps({"links": self.summary()}))

    def run(self) -> None:
        """Sample until stop() (blocking); see the module docstring."""
        readers = {ns: QdiscReader(ns) for ns in {link.netns for link in self.links}}
        index = {link: readers[link.netns].index(link.dev) for link in self.links}
        last: dict[Link, tuple] = {}
        written: dict[Link, float] = {}
        summarized = time.monotonic()
        with contextlib.ExitStack() as stack:
            fh = stack.enter_context(open(self.csv_path, "w", buffering=1)) if self.csv_path else None
            if fh:
                fh.write(",".join(FIELDS) + "\n")
            while True:
                final = self._stop.is_set()  # one last row per device, so the file covers the whole run
                roots = {ns: reader.roots() for ns, reader in readers.items()}
                t = clock_now(self.clock) if self.clock else None
                now = time.monotonic()
                for link in self.links:
                    s = roots[link.netns].get(index[link])
                    if s is None:
                        continue
                    delay = s.queue_delay_s
                    delay_ms = None if delay is None else delay * 1e3
                    if t is not None:
                        self.stats.setdefault(link, LinkStats(DelayHistogram(), s.drops)).add(t, delay_ms, s.drops)
                    state = (s.backlog_bytes, s.drops, s.sent_bytes, s.rate_bps)
                    if fh is None or (not final and state == last.get(link) and now - written.get(link, 0.0) < 1.0):
                        continue
                    last[link], written[link] = state, now
                    fh.write(f"{'' if t is None else round(t, 4)},{link.label},{s.backlog_bytes},"
                             f"{s.backlog_packets},{'' if delay_ms is None else round(delay_ms, 3)},{s.drops},"
                             f"{s.sent_bytes},{'' if s.rate_bps is None else round(s.rate_bps / 1e6, 3)}\n")
                if final or now - summarized >= self.SUMMARY_EVERY_S:
                    self._write_summary()
                    summarized = now
                if final:
                    break
                self._stop.wait(self.every_s)
        for reader in readers.values():
            reader.close()

    def start(self) -> Sampler:
        """run() in a daemon thread (the shaping sidecar's)."""
        self._thread = threading.Thread(target=self.run, name="queue-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask run() to take its last sample and write the summary; wait for it when it runs in a thread."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)


def read_rows(path: str) -> list[dict]:
    """A CSV's rows as dicts (none when the file does not exist)."""
    try:
        with open(path) as fh:
            return list(csv.DictReader(fh))
    except FileNotFoundError:
        return []


def read_summary(path: str) -> dict[str, dict]:
    """The per-link summary a Sampler wrote (empty when there is none)."""
    try:
        with open(path) as fh:
            return json.load(fh)["links"]
    except (OSError, ValueError, KeyError):
        return {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dev", action="append", required=True, type=Link.parse, metavar="[LABEL=][NETNS:]DEV",
                    help="a device whose root qdisc to sample, in a named network namespace (ip netns) or this "
                         "process's, labelled in the CSV (default: DEV); repeat for more")
    ap.add_argument("--clock", help="the training clock file (rows carry its time; the summary covers it)")
    ap.add_argument("--every", type=float, default=0.01, help="seconds between samples (default 0.01)")
    ap.add_argument("--out", help="CSV of the samples")
    ap.add_argument("--summary", help="JSON of the per-link summary (rewritten every 5 s and at the end)")
    args = ap.parse_args(argv)
    sampler = Sampler(args.dev, args.clock, args.out, args.summary, args.every)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sampler.stop())
    try:
        sampler.run()
    except OSError as e:
        print(f"netsense queue sampler: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
