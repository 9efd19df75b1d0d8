"""Root qdisc statistics over rtnetlink (RTM_GETQDISC): what ``tc -s qdisc show`` prints, without a fork.

A fork of ``tc`` costs ~5 ms here; a netlink dump of every qdisc of a namespace
~0.1 ms, so the queue sampler (netsense.shaping.queue) can read 100 times a
second and the profile follower (netsense.shaping.shaper) can watch a queue drain
after a rate change. A netlink socket belongs to the network namespace it was
opened in: ``in_netns`` enters one briefly, in the calling thread only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import struct
from dataclasses import dataclass

RTM_GETQDISC = 38
RTM_NEWQDISC = 36
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TC_H_ROOT = 0xFFFFFFFF
TCA_KIND, TCA_OPTIONS, TCA_STATS2 = 1, 2, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3
TCA_TBF_PARMS, TCA_TBF_RATE64 = 1, 4
HEADER = struct.Struct("=IHHII")  # nlmsghdr
TCMSG = struct.Struct("=BxxxiIII")  # tcmsg: family, ifindex, handle, parent, info


@dataclass(frozen=True)
class QdiscStats:
    kind: str
    sent_bytes: int
    backlog_bytes: int
    backlog_packets: int
    drops: int
    rate_bps: float | None  # a TBF's rate; None for other qdiscs

    @property
    def queue_delay_s(self) -> float | None:
        return self.backlog_bytes * 8 / self.rate_bps if self.rate_bps else None


def _attrs(data: bytes) -> dict[int, bytes]:
    """rtattrs (len u16, type u16, payload, 4-byte aligned) by type (nested flag masked off)."""
    out, i = {}, 0
    while i + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, i)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[i + 4:i + length]
        i += (length + 3) & ~3
    return out


def _parse(payload: bytes) -> tuple[int, int, QdiscStats] | None:
    """(ifindex, parent, stats) of one RTM_NEWQDISC message."""
    _, ifindex, _, parent, _ = TCMSG.unpack_from(payload)
    attrs = _attrs(payload[TCMSG.size:])
    if TCA_STATS2 not in attrs:
        return None
    kind = attrs.get(TCA_KIND, b"").rstrip(b"\0").decode()
    stats = _attrs(attrs[TCA_STATS2])
    sent = struct.unpack_from("=Q", stats[TCA_STATS_BASIC])[0] if TCA_STATS_BASIC in stats else 0
    qlen = backlog = drops = 0
    if TCA_STATS_QUEUE in stats:
        qlen, backlog, drops, _, _ = struct.unpack_from("=IIIII", stats[TCA_STATS_QUEUE])
    rate = None
    if kind == "tbf" and TCA_OPTIONS in attrs:
        opts = _attrs(attrs[TCA_OPTIONS])
        if TCA_TBF_RATE64 in opts:
            rate = struct.unpack_from("=Q", opts[TCA_TBF_RATE64])[0] * 8.0
        elif TCA_TBF_PARMS in opts:
            rate = struct.unpack_from("=I", opts[TCA_TBF_PARMS], 8)[0] * 8.0  # tc_ratespec.rate, bytes/s
    return ifindex, parent, QdiscStats(kind, sent, backlog, qlen, drops, rate)


_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


@contextlib.contextmanager
def in_netns(name: str | None):
    """Run the body in network namespace ``name`` (this thread only: setns moves the calling thread). A socket
    made inside stays in that namespace afterwards, so one sampler reads the links of many namespaces."""
    if name is None:
        yield
        return
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"entering network namespace {name}: {os.strerror(err)}")
        yield
    finally:
        _libc.setns(own, CLONE_NEWNET)
        os.close(own)
        os.close(target)


class QdiscReader:
    """Root qdisc statistics of devices in one network namespace (default: this process's)."""

    def __init__(self, netns: str | None = None) -> None:
        with in_netns(netns):
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
            self.sock.bind((0, 0))
        self.netns = netns
        self.seq = 0

    def index(self, dev: str) -> int:
        with in_netns(self.netns):
            return socket.if_nametoindex(dev)

    def close(self) -> None:
        self.sock.close()

    def roots(self) -> dict[int, QdiscStats]:
        """ifindex -> its root qdisc's statistics (one dump of every qdisc)."""
        self.seq += 1
        body = TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        self.sock.send(HEADER.pack(HEADER.size + len(body), RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, self.seq, 0)
                       + body)
        out: dict[int, QdiscStats] = {}
        while True:
            data = self.sock.recv(1 << 16)
            i = 0
            while i + HEADER.size <= len(data):
                length, kind, _, seq, _ = HEADER.unpack_from(data, i)
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR:
                    errno = -struct.unpack_from("=i", data, i + HEADER.size)[0]
                    raise OSError(errno, f"RTM_GETQDISC: {os.strerror(errno)}")
                if kind == RTM_NEWQDISC and seq == self.seq:
                    parsed = _parse(data[i + HEADER.size:i + length])
                    if parsed and parsed[1] == TC_H_ROOT:
                        out[parsed[0]] = parsed[2]
                i += (length + 3) & ~3

    def read(self, dev: str) -> QdiscStats | None:
        return self.roots().get(self.index(dev))
