"""A one-node Kubernetes cluster on this machine, from real parts, for the end-to-end tests.

Everything a pod needs, run as local processes (no Docker, no registry, no systemd):

    etcd + kube-apiserver     support.envtest.ControlPlane, listening on the pod bridge's gateway
    kube-controller-manager   service accounts, EndpointSlices, the garbage collector, the node's taints
    kube-scheduler            binds pods to the node
    containerd + runc         Debian's containerd 1.6 behind kubelet's CRI (root, state and socket private)
    kubelet                   cgroup v1 and the cgroupfs driver (this VM has no cgroup v2, no systemd)
    kube-proxy                iptables mode: Service IPs (the operator reaches the API as 10.96.0.1)
    CoreDNS                   the cluster's DNS (cluster.local only: nothing outside is ever asked),
                              a host process listening on the bridge's gateway address
    CNI                       bridge + host-local + loopback (Debian's containernetworking-plugins)

Binaries come from ``testbed/envtest/build.sh --node`` (Go modules, cached); images from
``testbed/node/images.sh`` (podman on a Debian-bootstrapped base), imported into containerd,
whose image store is kept under ~/.cache/netsense/node so a warm start imports nothing.

    with LocalNode() as node:        # Ready in ~30 s warm
        node.kubeconfig              # admin kubeconfig; kubectl works with it

``python -m support.node up`` (from tests/) runs one in the foreground until Ctrl-C or SIGTERM;
``python -m support.node down`` removes whatever a killed run left (processes, mounts, network
namespaces, the bridge, kube-proxy's iptables rules, the kubepods cgroups). Both are idempotent.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

from support.envtest import (
    REPO,
    SERVICE_CIDR,
    ControlPlane,
    EnvtestError,
    Supervised,
    _stop_on,
)

NODE_NAME = "netsense-node"
BRIDGE = "nsk0"
GATEWAY = "10.244.0.1"  # the bridge's address: the node's IP, the API server's and the cluster DNS's
POD_CIDR = "10.244.0.0/24"
API_PORT = 16443
STATE = "/run/netsense-node"  # sockets, containerd's state, the kubelet's root, logs: gone at `down`
CACHE = os.path.join(os.environ.get("NETSENSE_CACHE", os.path.expanduser("~/.cache/netsense")), "node")
CONTAINERD_ROOT = os.path.join(CACHE, "containerd")  # the image store: kept between runs
SOCKET = os.path.join(STATE, "containerd.sock")
KUBECONFIG = os.path.join(STATE, "kubeconfig")
BUILD = os.path.join(REPO, "testbed", "envtest", "build.sh")
IMAGES = os.path.join(REPO, "testbed", "node", "images.sh")
CGROUP_ROOT = "/sys/fs/cgroup"


class NodeError(EnvtestError):
    pass


def _run(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)}: {(proc.stderr or proc.stdout).strip()[-2000:]}")
    return proc


def node_binaries() -> str:
    """kubelet & co. (and links to the control plane's), built from Go modules on first use."""
    proc = _run("bash", BUILD, "--node", check=False)
    if proc.returncode != 0:
        raise NodeError(f"building the node's binaries failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def _containerd_config() -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{CONTAINERD_ROOT}"
state = "{STATE}/containerd"
[grpc]
  address = "{SOCKET}"
[ttrpc]
  address = "{SOCKET}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{STATE}/opt"
[{cri}]
  sandbox_image = "docker.io/netsense/pause:dev"
  # runc cannot lower the OOM score this VM's containerd gives itself ("can't get final child's PID")
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{STATE}/cni"
  [{cri}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""


def _cni_config() -> str:
    return json.dumps({
        "cniVersion": "0.4.0", "name": "netsense-node",
        "plugins": [{"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                     "ipam": {"type": "host-local", "dataDir": f"{STATE}/ipam",
                              "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                              "routes": [{"dst": "0.0.0.0/0"}]}}]})


def _kubelet_config() -> str:
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This VM runs cgroup v1 without systemd: kubelet >= 1.35 refuses v1 unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://{SOCKET}
authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}
authorization: {{mode: AlwaysAllow}}
address: {GATEWAY}
clusterDomain: cluster.local
clusterDNS: [{GATEWAY}]
podLogsDir: {STATE}/pod-logs
volumePluginDir: {STATE}/volume-plugins
enforceNodeAllocatable: []
# A build machine's disk is shared: never evict the test's pods or its images for it.
evictionHard: {{memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
"""


def _corefile(kubeconfig: str) -> str:
    return f""".:53 {{
    bind {GATEWAY}
    errors
    ready {GATEWAY}:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
    }}
    cache 5
}}
"""


class LocalNode(Supervised):
    def __init__(self, log_dir: str | None = None, load_images: bool = True):
        self.log_dir = log_dir or os.path.join(CACHE, "logs")  # kept after `down`, for a failed run
        self.load_images = load_images
        self.cp: ControlPlane | None = None
        self.procs: list[subprocess.Popen] = []
        self.kubeconfig = KUBECONFIG

    def _write(self, name: str, text: str) -> str:
        path = os.path.join(STATE, name)
        with open(path, "w") as fh:
            fh.write(text)
        return path

    def start(self, timeout: float = 120) -> None:
        down()  # a killed run's leftovers would collide with ours
        bins = node_binaries()
        for d in (STATE, self.log_dir, CONTAINERD_ROOT, f"{STATE}/cni", f"{STATE}/kubelet"):
            os.makedirs(d, exist_ok=True)
        # The bridge exists before anything listens on its address; the CNI plugin adopts it.
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        # Its certificates and etcd's data under STATE, so that `down` sweeps them after a SIGKILLed supervisor
        # (in the system's /tmp each such run left 123 MB behind).
        self.cp = ControlPlane(bins, log_dir=self.log_dir, address=GATEWAY, for_node=True, port=API_PORT,
                               parent_dir=STATE)
        self.cp.start()
        with open(self.cp.kubeconfig) as src, open(KUBECONFIG, "w") as dst:
            dst.write(src.read())
        self._write("cni/10-netsense.conflist", _cni_config())
        self._spawn("containerd", ["containerd", "--config", self._write("containerd.toml", _containerd_config())])
        self._wait(lambda: os.path.exists(SOCKET), 30, "containerd's socket")
        if self.load_images:
            proc = _run("bash", IMAGES, "load", SOCKET, check=False)
            if proc.returncode != 0:
                raise NodeError(f"loading the images into containerd failed:\n{proc.stderr[-3000:]}")
        kc, d = self.cp.kubeconfig, self.cp.dir
        self._spawn("kubelet", [f"{bins}/kubelet", f"--kubeconfig={kc}",
                                f"--config={self._write('kubelet.yaml', _kubelet_config())}",
                                f"--root-dir={STATE}/kubelet", f"--hostname-override={NODE_NAME}",
                                f"--node-ip={GATEWAY}", "--v=1"])
        auth = [f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}"]
        self._spawn("kube-scheduler", [f"{bins}/kube-scheduler", f"--kubeconfig={kc}", "--leader-elect=false",
                                       "--bind-address=127.0.0.1", *auth])
        self._spawn("kube-controller-manager", [
            f"{bins}/kube-controller-manager", f"--kubeconfig={kc}", "--leader-elect=false",
            "--bind-address=127.0.0.1", *auth,
            f"--service-account-private-key-file={d}/sa.key", f"--root-ca-file={d}/ca.crt",
            "--use-service-account-credentials=false", f"--cluster-cidr={POD_CIDR}",
            f"--service-cluster-ip-range={SERVICE_CIDR}"])
        # conntrack limits are the host's business, not a test node's: leave them as they are.
        self._spawn("kube-proxy", [f"{bins}/kube-proxy", f"--kubeconfig={kc}", "--proxy-mode=iptables",
                                   f"--hostname-override={NODE_NAME}", f"--cluster-cidr={POD_CIDR}",
                                   "--conntrack-max-per-core=0", "--metrics-bind-address=127.0.0.1:10249",
                                   "--healthz-bind-address=127.0.0.1:10256"])
        self._spawn("coredns", [f"{bins}/coredns", "-conf", self._write("Corefile", _corefile(kc))])
        self._wait(self._node_ready, timeout, f"node {NODE_NAME} Ready")
        self._wait(self._dns_ready, 60, "CoreDNS ready")

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_running(what)
            if ready():
                return
            time.sleep(0.5)
        raise NodeError(f"no {what} after {timeout:.0f}s; logs in {self.log_dir}")

    def _node_ready(self) -> bool:
        proc = _run("kubectl", f"--kubeconfig={self.kubeconfig}", "get", "node", NODE_NAME, "-o",
                    "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False,
                    env={**os.environ, "PATH": f"{self.cp.bin_dir}:{os.environ['PATH']}"})
        return proc.stdout.strip() == "True"

    def _dns_ready(self) -> bool:
        try:
            with socket.create_connection((GATEWAY, 8181), timeout=1) as s:
                s.sendall(b"GET /ready HTTP/1.0\r\n\r\n")
                return b" 200 " in s.recv(64)
        except OSError:
            return False

    def stop(self) -> None:
        """The controllers first (nothing re-creates a pod), then the pods (the kubelet tears their sandboxes
        and networks down), then the node, then a sweep for whatever that left."""
        by_name = {os.path.basename(p.args[0]): p for p in self.procs}
        for name in ("kube-controller-manager", "kube-scheduler"):
            if name in by_name:
                self._terminate(by_name[name])
        kubelet = by_name.get("kubelet")
        if kubelet is not None and kubelet.poll() is None and self.cp is not None:
            kubectl = [f"{self.cp.bin_dir}/kubectl", f"--kubeconfig={self.kubeconfig}"]
            _run(*kubectl, "delete", "pods", "--all", "--all-namespaces", "--grace-period=0", "--force",
                 "--wait=false", check=False, timeout=60)
            self._wait_no_sandboxes(60)
        for p in reversed(self.procs):
            self._terminate(p)
        self.procs.clear()
        if self.cp is not None:
            self.cp.stop()
        down()

    def _wait_no_sandboxes(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = _run("ctr", "--address", SOCKET, "-n", "k8s.io", "tasks", "ls", "-q", check=False).stdout
            if not out.strip():
                return
            time.sleep(1)


def _pids(pattern: str) -> list[int]:
    out = _run("pgrep", "-f", pattern, check=False).stdout
    return [int(p) for p in out.split() if int(p) != os.getpid()]


def _node_pids() -> list[int]:
    """containerd, the shims and the node's binaries: everything that names the state dir or the binaries'."""
    return _pids(STATE) + _pids(f"{CACHE}/k8s-")


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _mounts() -> list[str]:
    with open("/proc/mounts") as fh:
        targets = [line.split()[1] for line in fh]
    return [t for t in targets if t.startswith((STATE, CONTAINERD_ROOT))]


def _cni_netns() -> list[str]:
    return [n for n in _run("ip", "netns", "list", check=False).stdout.split() if n.startswith("cni-")]


def _cgroups() -> list[str]:
    """The kubelet's cgroups (kubepods, the QoS classes, each pod's), deepest first."""
    found = []
    for controller in os.listdir(CGROUP_ROOT) if os.path.isdir(CGROUP_ROOT) else []:
        top = os.path.join(CGROUP_ROOT, controller, "kubepods")
        if os.path.isdir(top) and not os.path.islink(os.path.join(CGROUP_ROOT, controller)):
            found += [root for root, _, _ in os.walk(top)]
    return sorted(found, key=len, reverse=True)


def leftovers() -> dict[str, list]:
    """What a node run leaves on the machine if it is not torn down (empty lists after `down`)."""
    bridge = _run("ip", "link", "show", BRIDGE, check=False).returncode == 0
    kube_chains = [f"{tool} {table} {chain}" for tool, table, chain in _kube_chains()]
    return {"processes": _node_pids(), "mounts": _mounts(), "netns": _cni_netns(),
            "bridge": [BRIDGE] if bridge else [], "iptables": kube_chains, "cgroups": _cgroups(),
            "state": [STATE] if os.path.exists(STATE) else []}


def _kube_chains() -> list[tuple[str, str, str]]:
    """(tool, table, chain) of the KUBE-* chains that kube-proxy and the kubelet made, IPv4 and IPv6."""
    found = []
    for tool in ("iptables", "ip6tables"):
        table = None
        for line in _run(f"{tool}-save", check=False).stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":KUBE-"):
                found.append((tool, table, line[1:].split()[0]))
    return found


def _remove_kube_chains() -> None:
    """kube-proxy --cleanup leaves the kubelet's chains (KUBE-FIREWALL, the canaries): jumps to them from
    the built-in chains go first, then the chains."""
    chains = _kube_chains()
    for tool, table in {(tool, table) for tool, table, _ in chains}:
        for rule in _run(tool, "-t", table, "-S", check=False).stdout.splitlines():
            parts = shlex.split(rule)
            if parts[:1] == ["-A"] and not parts[1].startswith("KUBE-") and "KUBE-" in rule:
                _run(tool, "-t", table, "-D", *parts[1:], check=False)
    for tool, table, chain in chains:
        _run(tool, "-t", table, "-F", chain, check=False)
    for tool, table, chain in chains:
        _run(tool, "-t", table, "-X", chain, check=False)


def _kill_containers() -> None:
    """Containers' processes outlive a killed shim: they are found by the kubelet's cgroups."""
    for cg in _cgroups():
        try:
            with open(os.path.join(cg, "cgroup.procs")) as fh:
                _signal([int(p) for p in fh.read().split()], signal.SIGKILL)
        except OSError:
            continue


def down() -> None:
    """Remove everything a node run may have left, whatever state it died in. Idempotent."""
    _kill_containers()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _node_pids()
        _signal(pids, sig)
        deadline = time.monotonic() + 10
        while pids and time.monotonic() < deadline and _node_pids():
            time.sleep(0.2)
    for target in sorted(_mounts(), key=len, reverse=True):
        _run("umount", "-l", target, check=False)
    for name in _cni_netns():
        _run("ip", "netns", "delete", name, check=False)
    _run("ip", "link", "delete", BRIDGE, check=False)
    for proxy in glob.glob(f"{CACHE}/k8s-*/bin/kube-proxy")[:1]:  # its own rules, whatever it left
        _run(proxy, "--cleanup", "--proxy-mode=iptables", check=False)
    _remove_kube_chains()
    _kill_containers()
    for cg in _cgroups():
        try:
            os.rmdir(cg)
        except OSError:
            pass
    _run("rm", "-rf", "--one-file-system", STATE, check=False)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("up", "down", "leftovers"):
        print("usage: python -m support.node up | down | leftovers", file=sys.stderr)
        return 2
    if argv[0] == "down":
        found = {k: len(v) for k, v in leftovers().items() if v}
        down()
        left = {k: v for k, v in leftovers().items() if v}
        # Nothing found is the usual case after a clean Ctrl-C of `make node-up` (it tears down what it made)
        said = ", ".join(f"{n} {k}" for k, n in found.items()) or "nothing: no node is running and none left anything"
        print(f"node down: swept {said}" + (f"; still there: {json.dumps(left)}" if left else ""))
        return 1 if left else 0
    if argv[0] == "leftovers":
        left = {k: v for k, v in leftovers().items() if v}
        print(json.dumps(left, indent=1) if left else "nothing left behind")
        return 1 if left else 0
    _stop_on(signal.SIGINT, signal.SIGTERM)
    try:
        with LocalNode() as node:
            print(f"node {NODE_NAME} is Ready   (Ctrl-C or SIGTERM tears it down); in another terminal:\n"
                  f"export KUBECONFIG={node.kubeconfig}\n"
                  f"export PATH={node_binaries()}:$PATH   # its kubectl, of the server's version", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        left = {k: v for k, v in leftovers().items() if v}
        print(f"node {NODE_NAME} torn down" + (f"; left behind (make node-down sweeps it): {json.dumps(left)}"
                                                if left else ": nothing left behind"), flush=True)
        return 0
    except NodeError as e:
        print(f"node: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
