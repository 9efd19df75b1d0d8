"""Link shaping with Linux tc: an HTB class whose rate follows a profile.

Why the ``tc`` binary and not a netlink library (pyroute2): iproute2 is in every
image that has NET_ADMIN tooling, every command we run is one a user can paste to
reproduce or debug by hand (they are logged), and tc's error messages are the ones
people search for. The cost, a fork per change, is ~5 ms, and profiles change at
most a few times a second.

Layout on the shaped device::

    root 1: htb default 1
      class 1:1 htb rate R ceil R burst B cburst B
        leaf 10: bfifo limit Q        (or netem delay/jitter/loss limit Q)

Rate changes are ``tc class change`` in place: the qdisc is never replaced, so
TCP connections (and gloo/NCCL rings) survive a change and it binds within
milliseconds. Burst is ~5 ms of data but at least 15 kB (one GSO burst at low
rates would otherwise overshoot; a whole second of burst makes a 10 Mbit link
look like 20). The queue holds ~100 ms of data so slow links are not starved of
buffer and fast ones do not bloat.

Ingress is shaped through an ifb device: an ingress qdisc redirects every
incoming packet (mirred) to the ifb, whose egress carries the same HTB tree.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass

from netsense.shaping.profiles import Impairments

log = logging.getLogger("netsense.tc")

NO_NETEM = "this kernel has no netem qdisc: delay/jitter/loss profiles cannot run here"


class TcError(RuntimeError):
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


def htb_params(rate_bps: float) -> dict[str, int]:
    """Burst and queue sized from the rate (see the module docstring)."""
    bytes_per_s = rate_bps / 8
    return {
        "rate": max(8, int(rate_bps)),
        "burst": int(max(15_000, bytes_per_s * 0.005)),
        "limit": int(max(200_000, bytes_per_s * 0.1)),
    }


@dataclass
class TcLink:
    """One shaped direction of one device."""

    dev: str
    netns: str | None = None
    ingress: bool = False
    impairments: Impairments = Impairments()
    _applied: bool = False

    @property
    def ifb(self) -> str:
        return f"ifb-{self.dev}"[:15]

    @property
    def shaped_dev(self) -> str:
        return self.ifb if self.ingress else self.dev

    def _tc(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run_tc(["tc", *args], self.netns, check)

    def _class_args(self, rate_bps: float) -> list[str]:
        p = htb_params(rate_bps)
        return ["htb", "rate", f"{p['rate']}bit", "ceil", f"{p['rate']}bit",
                "burst", str(p["burst"]), "cburst", str(p["burst"]), "quantum", "60000"]

    def _leaf_args(self, rate_bps: float) -> list[str]:
        limit = htb_params(rate_bps)["limit"]
        imp = self.impairments
        if not imp.any:
            return ["bfifo", "limit", str(limit)]
        args = ["netem", "limit", str(max(1000, limit // 1500))]
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
        self._tc("qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
        self._tc("class", "replace", "dev", dev, "parent", "1:", "classid", "1:1", *self._class_args(rate_bps))
        self._tc("qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:", *self._leaf_args(rate_bps))

    def change(self, rate_bps: float) -> None:
        """Change the rate in place (connections survive)."""
        dev = self.shaped_dev
        self._tc("class", "change", "dev", dev, "parent", "1:", "classid", "1:1", *self._class_args(rate_bps))
        self._tc("qdisc", "change", "dev", dev, "parent", "1:1", "handle", "10:", *self._leaf_args(rate_bps))

    def teardown(self) -> None:
        """Remove everything setup added; never raises (the device may be gone already)."""
        if not self._applied:
            return
        self._tc("qdisc", "del", "dev", self.shaped_dev, "root", check=False)
        if self.ingress:
            self._tc("qdisc", "del", "dev", self.dev, "ingress", check=False)
            run_tc(["ip", "link", "del", self.ifb], self.netns, check=False)
        self._applied = False


def qdiscs(dev: str, netns: str | None = None) -> str:
    """`tc qdisc show dev DEV` (for tests and diagnostics)."""
    return run_tc(["tc", "qdisc", "show", "dev", dev], netns, check=False).stdout
