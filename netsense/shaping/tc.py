"""Link shaping with Linux tc: a token bucket (TBF) whose rate follows a profile.

Why the ``tc`` binary and not a netlink library (pyroute2): iproute2 is in every
image that has NET_ADMIN tooling, every command we run is one a user can paste to
reproduce or debug by hand (they are logged), and tc's error messages are the ones
people search for. The cost, a fork per change, is ~5 ms, and profiles change at
most a few times a second.

Layout on the shaped device::

    root 1: tbf rate R burst B limit Q [peakrate 1.1R mtu 1514]
      (child 10: netem delay/jitter/loss, where asked and the kernel has it)

A link must be faithful for what a training step sends: a short payload after
an idle gap (evaluation, compute), not only bulk. The bucket is full after any
pause, so its size B is exactly what a payload gets for free; measured at the
receiver after 100 ms idle (netsense.emulation.bulk's payload mode):

- HTB as shipped before (burst ~5 ms, >= 15 kB, quantum 60000) let 47 kB cross
  a 50 Mbit link at 33x the rate and 100 kB a 200 Mbit link at 13x; cutting its
  burst to 1 ms still left 10 kB at 8x. TBF paces to its burst, so it is TBF.
- B is two MTUs (3028 bytes) up to ~200 Mbit: 47 kB-4 MB then cross at
  0.94-1.01x. At 1 Gbit two MTUs are too few: each refill is a timer wakeup,
  and at one per 24 us the link reached 0.2-0.7x. So B covers a wakeup interval
  that grows with the rate, 320 us x R / 1 Gbit (40 kB at 1 Gbit: 0.92-0.97x
  from 300 kB, bulk 0.9-0.95x; 31 kB read 0.84-0.87x in bulk under load, 62 kB
  let 47-100 kB through at 1.4x).
- Below ~100 Mbit even two MTUs are 2-3 ms of the rate, and 10 kB crossed 10
  and 20 Mbit at 1.3x. A peak-rate bucket (1.1 R, one MTU) paces the burst:
  1.05-1.19x. Above 100 Mbit its per-packet timer costs more than it saves
  (at 200 Mbit it stalled 47 kB to 0.36x), so it is only used below.

On a link whose rate changes, GSO packets are capped (``gso_max_segs``,
restored at teardown) below the bucket of the lowest rate it will carry
(``gso_max_size`` does not do it: TCP builds two-segment packets at least). TBF segments a
GSO packet larger than its bucket when it is queued, but one queued while the
bucket was larger stays whole, and when the bucket shrinks below it (1 Gbit ->
200 Mbit: 31 kB -> 3 kB) it can never be sent: the link stalled for good in a
2000 -> 1400 Mbit step. The cap costs where it is small: with one-frame
packets a link through the emulated cluster's bridge carried ~1.1 Gbit at most on 2
cores (0.95x of 2 Gbit over a plain veth pair) and bulk TCP reached 0.87-0.9x
of 200-500 Mbit (0.95x with full GSO), so a profile that visits 20 Mbit runs
its fast steps a little slow here. A static link keeps full GSO. Senders whose traffic is shaped on ingress only
(``--direction ingress``) keep their own GSO; shape their egress too.

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
from dataclasses import dataclass

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
PEAKRATE_BELOW_BPS = 100e6  # pace the burst with a peak-rate bucket below this rate
PEAK_FACTOR = 1.1
GSO_SEGS_LIMIT = 65535  # the kernel's default


def tbf_params(rate_bps: float) -> dict[str, int]:
    """Bucket, queue and peak rate sized from the rate (see the module docstring)."""
    bytes_per_s = rate_bps / 8
    wakeup_s = 320e-6 * rate_bps / 1e9
    return {
        "rate": max(8, int(rate_bps)),
        "burst": int(max(2 * MTU_FRAME, bytes_per_s * wakeup_s)),
        "limit": int(max(200_000, bytes_per_s * 0.1)),
        "peakrate": int(rate_bps * PEAK_FACTOR) if rate_bps < PEAKRATE_BELOW_BPS else 0,
    }


@dataclass
class TcLink:
    """One shaped direction of one device."""

    dev: str
    netns: str | None = None
    ingress: bool = False
    impairments: Impairments = Impairments()
    _applied: bool = False
    _gso_max_segs: int | None = None  # the device's own, restored at teardown

    @property
    def ifb(self) -> str:
        return f"ifb-{self.dev}"[:15]

    @property
    def shaped_dev(self) -> str:
        return self.ifb if self.ingress else self.dev

    def _tc(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run_tc(["tc", *args], self.netns, check)

    def _tbf_args(self, rate_bps: float) -> list[str]:
        p = tbf_params(rate_bps)
        args = ["tbf", "rate", f"{p['rate']}bit", "burst", str(p["burst"]), "limit", str(p["limit"])]
        if p["peakrate"]:
            args += ["peakrate", f"{p['peakrate']}bit", "mtu", str(MTU_FRAME)]
        return args

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

    def setup(self, rate_bps: float, lowest_bps: float | None = None) -> None:
        """Install the tree at the first rate. Safe to call on a device shaped before.

        ``lowest_bps``: the lowest rate change() will set, for a link whose rate will change (it caps
        the GSO size: see the module docstring); None for a link whose rate stays."""
        if self.ingress:
            run_tc(["ip", "link", "add", self.ifb, "type", "ifb"], self.netns, check=False)
            run_tc(["ip", "link", "set", self.ifb, "up"], self.netns)
            self._tc("qdisc", "del", "dev", self.dev, "ingress", check=False)
            self._tc("qdisc", "add", "dev", self.dev, "handle", "ffff:", "ingress")
            self._tc("filter", "add", "dev", self.dev, "parent", "ffff:", "protocol", "all", "u32",
                     "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", self.ifb)
        dev = self.shaped_dev
        self._applied = True  # from here on, teardown has something to remove
        if self._gso_max_segs is None:
            self._gso_max_segs = gso_max_segs(dev, self.netns)
        segs = self._gso_max_segs or GSO_SEGS_LIMIT  # a link whose rate stays keeps its bucket: nothing outgrows it
        if lowest_bps is not None:
            segs = gso_segs_below(min(rate_bps, lowest_bps))
        set_gso_max_segs(dev, self.netns, segs)
        self._tc("qdisc", "replace", "dev", dev, "root", "handle", "1:", *self._tbf_args(rate_bps))
        if self.impairments.any:
            self._tc("qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:", *self._netem_args(rate_bps))

    def change(self, rate_bps: float) -> None:
        """Change the rate in place (connections survive)."""
        dev = self.shaped_dev
        self._tc("qdisc", "change", "dev", dev, "root", "handle", "1:", *self._tbf_args(rate_bps))
        if self.impairments.any:
            self._tc("qdisc", "change", "dev", dev, "parent", "1:1", "handle", "10:", *self._netem_args(rate_bps))

    def teardown(self) -> None:
        """Remove everything setup added; never raises (the device may be gone already)."""
        if not self._applied:
            return
        self._tc("qdisc", "del", "dev", self.shaped_dev, "root", check=False)
        if self._gso_max_segs:
            set_gso_max_segs(self.shaped_dev, self.netns, self._gso_max_segs, check=False)
            self._gso_max_segs = None
        if self.ingress:
            self._tc("qdisc", "del", "dev", self.dev, "ingress", check=False)
            run_tc(["ip", "link", "del", self.ifb], self.netns, check=False)
        self._applied = False


def gso_segs_below(lowest_bps: float) -> int:
    """The most segments a GSO packet may carry to fit the bucket at the lowest rate (module docstring)."""
    return max(1, tbf_params(lowest_bps)["burst"] // MTU_FRAME - 1)


def set_gso_max_segs(dev: str, netns: str | None, segs: int, check: bool = True) -> None:
    run_tc(["ip", "link", "set", "dev", dev, "gso_max_segs", str(segs)], netns, check)


def gso_max_segs(dev: str, netns: str | None = None) -> int | None:
    """The most segments in one of the device's GSO packets (None where ip does not say)."""
    out = run_tc(["ip", "-d", "link", "show", "dev", dev], netns, check=False).stdout.split()
    return int(out[out.index("gso_max_segs") + 1]) if "gso_max_segs" in out else None


def qdiscs(dev: str, netns: str | None = None) -> str:
    """`tc qdisc show dev DEV` (for tests and diagnostics)."""
    return run_tc(["tc", "qdisc", "show", "dev", dev], netns, check=False).stdout
