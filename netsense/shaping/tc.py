"""Link shaping with Linux tc: a token bucket (TBF) whose rate follows a profile.

Why the ``tc`` binary and not a netlink library (pyroute2): iproute2 is in every
image that has NET_ADMIN tooling, every command we run is one a user can paste to
reproduce or debug by hand (they are logged), and tc's error messages are the ones
people search for. The cost, a fork per change, is ~5 ms, and profiles change at
most a few times a second. (Reading a queue's counters is netlink: it is polled.)

Layout on the shaped device::

    root 1: tbf rate R burst B limit Q
      (child 10: netem delay/jitter/loss, where asked and the kernel has it)

The bucket B is one frame plus what the link carries in 150 us, and at least
320 us of the rate (testbed/link.py measures both sides of the trade):

- It is what a payload gets for free after an idle gap (evaluation, compute),
  so it must be small: HTB with a ~5 ms burst let 47 kB cross a 50 Mbit link at
  33x the rate. With B as above, 10 kB after 100 ms idle crossed 10-300 Mbit at
  1.12-1.22x and 47 kB-4 MB at 0.97-1.03x.
- Every refill of the bucket is a timer wakeup, and the kernel serves the timer
  late (tens of us in these VMs, more under load). A bucket that holds no more
  than what the link sends between two wakeups loses the lateness on every
  refill: two frames (the rule before this one) gave 0.86x of 200-250 Mbit in
  bulk, and a peak-rate bucket of one frame at 1.1 R, used then below 100 Mbit to
  pace the two-frame burst, gave 0.85-0.90x of 50 Mbit on one VM and 0.77x on
  another. One frame plus 150 us of slack gives 0.95-0.96x at 10-300 Mbit
  with no peak rate; the fixed 320 us x R / 1 Gbit part (40 kB at 1 Gbit)
  keeps fast links fed between wakeups (0.93-0.96x at 500 Mbit-1 Gbit).

A packet larger than the bucket cannot leave it: TBF cuts a GSO packet larger
than the bucket when it is queued, but one queued whole under a larger bucket
stalls the link for good when the bucket shrinks below it (1 Gbit -> 200
Mbit: 40 kB -> 5 kB). netsense.shaping.shaper prevents that on a link whose
rate changes: it keeps the senders' GSO packets to about half the bucket of
the rate in force, never more than two thirds (``GsoCap``: ``gso_max_segs``
plus a route-cache flush, which makes open TCP sockets take the new size), and
a shrinking bucket waits, at the new rate, until what was queued under the old
one has left. About half the bucket, not all of it: with packets as large as
the bucket one fits per wakeup (0.79-0.90x of 1 Gbit with 25-frame packets,
0.94-0.96x with 13). Not one frame either: one-frame packets from TCP carry
~300 Mbit/s at most on these 2-core VMs (0.85-0.87x of 225 Mbit, 0.90-0.95x
with two-frame packets).
A static link keeps the device's own GSO size (TBF cuts what does not fit).

Rate changes are ``tc qdisc change`` in place: the qdisc is never replaced, so
TCP connections (and gloo/NCCL rings) survive a change and it binds within
milliseconds. The queue holds ~100 ms of data (at least 200 kB) so slow links
are not starved of buffer and fast ones do not bloat.

Ingress is shaped through an ifb device: an ingress qdisc redirects every
incoming packet (mirred) to the ifb, whose egress carries the same TBF.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass, field

from netsense.errors import NetsenseError
from netsense.shaping.profiles import Impairments

log = logging.getLogger("netsense.tc")

NO_NETEM = "this kernel has no netem qdisc: delay/jitter/loss profiles cannot run here"


class TcError(NetsenseError, RuntimeError):
    pass


class NetemUnavailable(TcError):
    pass


def run_tc(args: list[str], netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run one tc/ip command (``args[0]`` is 'tc' or 'ip'), inside netns if given."""
    cmd = [args[0], *(["-n", netns] if netns else []), *args[1:]]
    log.debug("%s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        err = proc.stderr.strip()
        if "qdisc kind is unknown" in err and "netem" in args:
            raise NetemUnavailable(NO_NETEM)
        raise TcError(f"`{' '.join(cmd)}` failed: {err or 'exit ' + str(proc.returncode)}")
    return proc


MTU_FRAME = 1514  # an Ethernet frame of a 1500-byte MTU, as the qdisc counts it
TIMER_SLACK_S = 150e-6  # the bucket holds a frame plus this much of the rate: a late timer costs no throughput
FAST_REFILL_S = 320e-6  # ... and at least this x R / 1 Gbit of it (a fast link between wakeups)
GSO_SEGS_LIMIT = 65535  # the kernel's default


def tbf_params(rate_bps: float) -> dict[str, int]:
    """Bucket and queue sized from the rate (see the module docstring)."""
    bytes_per_s = rate_bps / 8
    return {
        "rate": max(8, int(rate_bps)),
        "burst": int(max(MTU_FRAME + bytes_per_s * TIMER_SLACK_S, bytes_per_s * FAST_REFILL_S * rate_bps / 1e9)),
        "limit": int(max(200_000, bytes_per_s * 0.1)),
    }


def gso_segs_for(rate_bps: float) -> int:
    """The most segments a sender's GSO packet may carry at this rate: about half the bucket, never more than two
    thirds of it (module docstring)."""
    return max(1, round(tbf_params(rate_bps)["burst"] / (2 * MTU_FRAME)))


@dataclass
class TcLink:
    """One shaped direction of one device."""

    dev: str
    netns: str | None = None
    ingress: bool = False
    impairments: Impairments = Impairments()
    burst: int = 0  # the bucket installed now (bytes); 0 before setup
    _applied: bool = False

    @property
    def ifb(self) -> str:
        return f"ifb-{self.dev}"[:15]

    @property
    def shaped_dev(self) -> str:
        return self.ifb if self.ingress else self.dev

    def _tc(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run_tc(["tc", *args], self.netns, check)

    def _tbf_args(self, rate_bps: float, burst: int | None) -> list[str]:
        p = tbf_params(rate_bps)
        self.burst = burst or p["burst"]
        return ["tbf", "rate", f"{p['rate']}bit", "burst", str(self.burst), "limit", str(p["limit"])]

    def _netem_args(self, rate_bps: float) -> list[str]:
        """The impairments as a netem child of the TBF (only called when there are some)."""
        imp = self.impairments
        args = ["netem", "limit", str(max(1000, tbf_params(rate_bps)["limit"] // 1500))]
        if imp.delay_s or imp.jitter_s:
            args += ["delay", f"{imp.delay_s * 1e6:.0f}us"]
            if imp.jitter_s:
                args += [f"{imp.jitter_s * 1e6:.0f}us"]
        if imp.loss:
            args += ["loss", f"{imp.loss * 100:.4f}%"]
        return args

    def setup(self, rate_bps: float) -> None:
        """Install the tree at the first rate. Safe to call on a device shaped before."""
        if self.ingress:
            run_tc(["ip", "link", "add", self.ifb, "type", "ifb"], self.netns, check=False)
            run_tc(["ip", "link", "set", self.ifb, "up"], self.netns)
            self._tc("qdisc", "del", "dev", self.dev, "ingress", check=False)
            self._tc("qdisc", "add", "dev", self.dev, "handle", "ffff:", "ingress")
            self._tc("filter", "add", "dev", self.dev, "parent", "ffff:", "protocol", "all", "u32",
                     "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", self.ifb)
        dev = self.shaped_dev
        self._applied = True  # from here on, teardown has something to remove
        self._tc("qdisc", "replace", "dev", dev, "root", "handle", "1:", *self._tbf_args(rate_bps, None))
        if self.impairments.any:
            self._tc("qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:", *self._netem_args(rate_bps))

    def change(self, rate_bps: float, burst: int | None = None) -> None:
        """Change the rate in place (connections survive); ``burst`` keeps a larger bucket than the rate's
        while packets queued under it drain (netsense.shaping.shaper)."""
        dev = self.shaped_dev
        self._tc("qdisc", "change", "dev", dev, "root", "handle", "1:", *self._tbf_args(rate_bps, burst))
        if self.impairments.any:
            self._tc("qdisc", "change", "dev", dev, "parent", "1:1", "handle", "10:", *self._netem_args(rate_bps))

    def teardown(self) -> None:
        """Remove everything setup added; never raises (the device may be gone already)."""
        if not self._applied:
            return
        self._tc("qdisc", "del", "dev", self.shaped_dev, "root", check=False)
        if self.ingress:
            self._tc("qdisc", "del", "dev", self.dev, "ingress", check=False)
            run_tc(["ip", "link", "del", self.ifb], self.netns, check=False)
        self._applied = False
        self.burst = 0


@dataclass
class GsoCap:
    """The senders' GSO packets kept to ``gso_segs_for`` the rate their links carry (module docstring).

    ``devs``: (netns, device) of every sender whose traffic crosses a link whose rate changes."""

    devs: list[tuple[str | None, str]]
    segs: int | None = None  # the cap in force; None before apply
    _own: dict[tuple[str | None, str], int] = field(default_factory=dict)  # each device's, restored at restore()

    def apply(self, rate_bps: float) -> None:
        segs = gso_segs_for(rate_bps)
        if segs == self.segs:
            return
        for netns, dev in self.devs:
            if (netns, dev) not in self._own:
                self._own[(netns, dev)] = gso_max_segs(dev, netns) or GSO_SEGS_LIMIT
            set_gso_max_segs(dev, netns, segs)
        for netns in {netns for netns, _ in self.devs}:
            # Open sockets read the device's GSO size when their route is looked up again: a flush makes them.
            run_tc(["ip", "route", "flush", "cache"], netns, check=False)
            run_tc(["ip", "-6", "route", "flush", "cache"], netns, check=False)
        self.segs = segs

    def restore(self) -> None:
        """The devices' own sizes back; never raises (a namespace may be gone already)."""
        for (netns, dev), segs in self._own.items():
            set_gso_max_segs(dev, netns, segs, check=False)
        self._own.clear()
        self.segs = None


def set_gso_max_segs(dev: str, netns: str | None, segs: int, check: bool = True) -> None:
    run_tc(["ip", "link", "set", "dev", dev, "gso_max_segs", str(segs)], netns, check)


def gso_max_segs(dev: str, netns: str | None = None) -> int | None:
    """The most segments in one of the device's GSO packets (None where ip does not say)."""
    out = run_tc(["ip", "-d", "link", "show", "dev", dev], netns, check=False).stdout.split()
    return int(out[out.index("gso_max_segs") + 1]) if "gso_max_segs" in out else None


def qdiscs(dev: str, netns: str | None = None) -> str:
    """`tc qdisc show dev DEV` (for tests and diagnostics)."""
    return run_tc(["tc", "qdisc", "show", "dev", dev], netns, check=False).stdout
