"""The local emulated cluster: N hosts as N network namespaces behind a switch.

Topology ``per-host`` (the default; id = 6 random hex digits, so runs can coexist)::

    nsense-<id>-h0  eth0 10.200.0.1/16 --veth-- h0 ┐
    nsense-<id>-h1  eth0 10.200.0.2/16 --veth-- h1 ┼ br0   (in nsense-<id>-br)
    ...                                            ┘

Each host's uplink (its eth0 egress) is shaped by the profile; with direction
"both" the bridge-side end of its veth is shaped too, which shapes the host's
downlink without an ifb device.

Topology ``shared``: two racks (bridges) joined by one link, the bottleneck
that every flow between racks shares, as a switch's uplink is::

    h0, h2, ... ┐                                     ┌ h1, h3, ...
    x0 (cross)  ┼ rackA ── up0 ══ shaped ══ up1 ── rackB ┼ x1 (cross)
                ┘          (all in nsense-<id>-br)     └

Even ranks sit on rack A and odd ranks on rack B, so every hop of a ring
(rank r to r+1) crosses the shared link. Its two directions are shaped by the
profile (up0's egress carries A -> B, up1's B -> A); the hosts' own links are
not shaped. With cross traffic, host x0 (10.200.1.1) on rack A sends to x1
(10.200.1.2) on rack B, in the direction of the ring's even -> odd hops.

The addresses exist only inside these namespaces; nothing is routed to or from
the machine's own network.

Cleanup is guaranteed on normal exit, exceptions, SIGINT and SIGTERM (the CLI
turns SIGTERM into an exception): processes are killed by process group, then
the namespaces are deleted, which removes their veths, bridges and qdiscs. A
state file under /run/netsense records the owner's pid, so ``netsense
clean`` can remove what a SIGKILLed run left behind.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import IO, TextIO

from netsense.errors import BadInput, NetsenseError
from netsense.shaping.profiles import Profile
from netsense.shaping.shaper import ProfileFollower
from netsense.shaping.tc import NO_NETEM, TcLink

PREFIX = "nsense-"
SUBNET = "10.200.0"  # workers; /16, so the cross-traffic hosts (10.200.1.x) share the segment
CROSS_SUBNET = "10.200.1"
TOPOLOGIES = ("per-host", "shared")
WORKER_ARGV = (sys.executable, "-m", "netsense", "worker")
STATE_DIR = os.environ.get("NETSENSE_STATE_DIR", "/run/netsense")


class EmulationError(NetsenseError, RuntimeError):
    """The emulated cluster failed; the message says why."""


class CannotRunHere(BadInput, EmulationError):
    """What the job asks cannot run on this machine (not root, no tc, no netem, a congestion control the kernel
    lacks): said before anything is created, and exit code 2 as for any input refused."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise EmulationError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def list_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def kernel_has_netem() -> bool:
    """Probe netem in a scratch namespace (removed at once)."""
    ns = f"{PREFIX}probe-{secrets.token_hex(3)}"
    _ip("netns", "add", ns)
    try:
        proc = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                              capture_output=True, text=True)
        return proc.returncode == 0
    finally:
        _ip("netns", "del", ns, check=False)


def preflight(profile: Profile | None) -> None:
    if os.geteuid() != 0:
        raise CannotRunHere("the emulated cluster needs root (network namespaces and tc); run it with sudo")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise CannotRunHere(f"`{tool}` is not installed (Debian/Ubuntu: apt-get install iproute2)")
    if profile is not None and profile.impairments.any and not kernel_has_netem():
        raise CannotRunHere(NO_NETEM)


class LocalCluster:
    def __init__(self, hosts: int, profile: Profile | None = None, direction: str = "egress",
                 shaping_log: TextIO | None = None, start_file: str | None = None,
                 topology: str = "per-host", cross_hosts: bool = False):
        """``start_file``: the profile's clock starts when a unix time appears there
        (the trainers write it at their first step); else when the cluster is up.
        ``cross_hosts``: add x0 and x1 for cross traffic (shared topology)."""
        if hosts < 1 or hosts > 250:
            raise EmulationError(f"hosts must be between 1 and 250 (got {hosts})")
        if topology not in TOPOLOGIES:
            raise EmulationError(f"topology must be one of {', '.join(TOPOLOGIES)} (got {topology!r})")
        if cross_hosts and topology != "shared":
            raise EmulationError("cross traffic needs the shared topology (it competes at the shared link)")
        self.hosts = hosts
        self.profile = profile
        self.direction = direction
        self.topology = topology
        self.cross_hosts = 2 if cross_hosts else 0
        self.id = secrets.token_hex(3)
        self.shaping_log = shaping_log
        self.start_file = start_file
        self.follower: ProfileFollower | None = None
        self.processes: list[subprocess.Popen] = []
        self._created: list[str] = []

    # -- names -------------------------------------------------------------------
    @property
    def bridge_ns(self) -> str:
        return f"{PREFIX}{self.id}-br"

    def host_ns(self, i: int) -> str:
        return f"{PREFIX}{self.id}-h{i}"

    def cross_ns(self, j: int) -> str:
        return f"{PREFIX}{self.id}-x{j}"

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    @staticmethod
    def cross_address(j: int) -> str:
        return f"{CROSS_SUBNET}.{j + 1}"

    @property
    def namespaces(self) -> list[str]:
        return [self.bridge_ns, *(self.host_ns(i) for i in range(self.hosts)),
                *(self.cross_ns(j) for j in range(self.cross_hosts))]

    def rack(self, i: int) -> str:
        """The bridge host i hangs off: br0, or on the shared topology br0 (even) / br1 (odd)."""
        return f"br{i % 2}" if self.topology == "shared" else "br0"

    @property
    def shaped(self) -> list[tuple[str, str, str]]:
        """(label, namespace, device) of every shaped link: up0 (rack A -> B) and up1 on the shared topology;
        h<i> (host i's uplink) and h<i>-down (its downlink, direction both) per host."""
        if self.profile is None:
            return []
        if self.topology == "shared":
            return [("up0", self.bridge_ns, "up0"), ("up1", self.bridge_ns, "up1")]
        links = [(f"h{i}", self.host_ns(i), "eth0") for i in range(self.hosts)]
        if self.direction == "both":
            links += [(f"h{i}-down", self.bridge_ns, f"h{i}") for i in range(self.hosts)]
        return links

    @property
    def state_file(self) -> str:
        return os.path.join(STATE_DIR, f"{self.id}.json")

    # -- lifecycle ---------------------------------------------------------------
    def __enter__(self) -> LocalCluster:
        preflight(self.profile)
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _create(self) -> None:
        os.makedirs(STATE_DIR, exist_ok=True)
        with open(self.state_file, "w") as fh:
            json.dump({"pid": os.getpid(), "namespaces": self.namespaces, "created": time.time()}, fh)
        br = self.bridge_ns
        self._add_ns(br)
        for bridge in ("br0", "br1") if self.topology == "shared" else ("br0",):
            _ip("-n", br, "link", "add", bridge, "type", "bridge")
            _ip("-n", br, "link", "set", bridge, "up")
        for i in range(self.hosts):
            self._add_host(self.host_ns(i), f"h{i}", self.address(i), self.rack(i))
        for j in range(self.cross_hosts):
            self._add_host(self.cross_ns(j), f"x{j}", self.cross_address(j), f"br{j}")
        if self.topology == "shared":
            _ip("-n", br, "link", "add", "up0", "type", "veth", "peer", "name", "up1")
            _ip("-n", br, "link", "set", "up0", "master", "br0", "up")
            _ip("-n", br, "link", "set", "up1", "master", "br1", "up")
        if self.profile is None:
            return
        imp = self.profile.impairments
        # Delay and loss once per direction of a path: not again on a host's downlink (direction both).
        links = [TcLink(dev, netns=ns, **({"impairments": imp} if imp.any and not label.endswith("-down") else {}))
                 for label, ns, dev in self.shaped]
        # Every host sends across the shaped links: on a changing rate its GSO packets follow the rate
        # (netsense.shaping.tc), on its own device whether or not that device is shaped.
        senders = [(ns, "eth0") for ns in self.namespaces[1:]]
        self.follower = ProfileFollower(self.profile, links, log=self.shaping_log, start_file=self.start_file,
                                        senders=senders).start()

    def _add_host(self, ns: str, port: str, address: str, bridge: str) -> None:
        self._add_ns(ns)
        # Create the pair straight inside both namespaces: no name ever exists in
        # the machine's own namespace, so concurrent runs cannot clash.
        _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", self.bridge_ns)
        _ip("-n", ns, "addr", "add", f"{address}/16", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", self.bridge_ns, "link", "set", port, "master", bridge, "up")

    def tcp_congestion_control(self) -> str:
        """The hosts' default TCP congestion control: the machine's, which a namespace may only change to
        one on the allowed list; every TCP number of a run depends on it, so results record it."""
        return subprocess.run(["ip", "netns", "exec", self.host_ns(0), "cat",
                               "/proc/sys/net/ipv4/tcp_congestion_control"],
                              capture_output=True, text=True).stdout.strip()

    @property
    def epoch(self) -> float | None:
        """Unix time at which the profile's clock started (None when unshaped or not yet)."""
        return self.follower.epoch if self.follower else None

    def spawn(self, i: int, argv: Sequence[str], env: dict[str, str] | None = None,
              stdout: int | IO | None = None, stderr: int | IO | None = None) -> subprocess.Popen:
        """Start a process in host i, in a process group of its own (so it can be killed whole)."""
        return self.spawn_in(self.host_ns(i), argv, env, stdout, stderr)

    def spawn_worker(self, i: int, env: dict[str, str], stdout: int | IO | None = None,
                     stderr: int | IO | None = None) -> subprocess.Popen:
        """Start rank i's `netsense worker` in host i (a fresh interpreter inside the host's namespace)."""
        return self.spawn(i, WORKER_ARGV, env, stdout, stderr)

    def spawn_in(self, ns: str, argv: Sequence[str], env: dict[str, str] | None = None,
                 stdout: int | IO | None = None, stderr: int | IO | None = None) -> subprocess.Popen:
        """Start a process in one of this cluster's namespaces (killed with the cluster)."""
        if ns not in self.namespaces:
            raise ValueError(f"{ns} is not a namespace of this cluster")
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], env=env,
                                stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        self.processes.append(proc)
        return proc

    def kill_processes(self, grace_s: float = 5.0) -> None:
        stop_processes(self.processes, grace_s)

    def close(self) -> None:
        """Idempotent; safe from a signal-driven unwind."""
        if self.follower:
            self.follower.stop(teardown=False)  # the namespaces (and their qdiscs) go below
            self.follower = None
        self.kill_processes()
        for ns in reversed(self._created):
            _kill_namespace_pids(ns)
            _ip("netns", "del", ns, check=False)
        self._created.clear()
        try:
            os.unlink(self.state_file)
        except FileNotFoundError:
            pass


def stop_processes(processes: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM to each process's group, ``grace_s`` for all of them to exit, then SIGKILL to every group (which
    also reaps children that outlived their leader); the list is emptied."""
    live = [p for p in processes if p.poll() is None]
    for p in live:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in processes:
        _signal_group(p, signal.SIGKILL)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    processes.clear()


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_namespace_pids(ns: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def clean(everything: bool = False) -> list[str]:
    """Remove namespaces of ours whose owning process is gone (or all with everything=True)."""
    owners: dict[str, int] = {}
    if os.path.isdir(STATE_DIR):
        for name in os.listdir(STATE_DIR):
            path = os.path.join(STATE_DIR, name)
            try:
                with open(path) as fh:
                    state = json.load(fh)
            except (OSError, ValueError):
                continue
            if everything or not _pid_alive(state["pid"]):
                os.unlink(path)
            for ns in state["namespaces"]:
                owners[ns] = state["pid"]
    removed = []
    for ns in list_namespaces():
        if not ns.startswith(PREFIX):
            continue
        pid = owners.get(ns)
        if everything or pid is None or not _pid_alive(pid):
            _kill_namespace_pids(ns)
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    return removed
