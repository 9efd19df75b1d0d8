"""A real Kubernetes control plane (etcd + kube-apiserver) as local processes.

The way controller-runtime's envtest runs them: no kubelet, no scheduler, no
controller-manager, so pods stay where tests put them (tests patch pod status as
a kubelet would). Binaries come from ``testbed/envtest/build.sh`` (built from Go
modules and cached) or from $KUBEBUILDER_ASSETS.

    with ControlPlane() as cp:          # ready in a few seconds from a warm cache
        cp.kubeconfig                   # admin (system:masters) kubeconfig path
        cp.token_kubeconfig(sa, ns)     # a restricted identity, for RBAC tests

``python -m tests.support.envtest`` starts one and prints its kubeconfig
until Ctrl-C, for poking at it with kubectl.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.request

import yaml

from netsense.emulation.loopback import free_port
from support import REPO

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGKILL when the process that started it exits (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

BUILD_SCRIPT = os.path.join(REPO, "testbed", "envtest", "build.sh")
SERVICE_CIDR = "10.96.0.0/24"


class EnvtestError(RuntimeError):
    pass


def binaries_dir(build: bool = True) -> str | None:
    """Where kube-apiserver and etcd are: $KUBEBUILDER_ASSETS, or the cache (building if asked)."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and all(os.access(os.path.join(assets, b), os.X_OK) for b in ("kube-apiserver", "etcd")):
        return assets
    if not build:
        return None
    proc = subprocess.run(["bash", BUILD_SCRIPT], capture_output=True, text=True)
    if proc.returncode != 0:
        raise EnvtestError(f"building the envtest binaries failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def _openssl(*args: str, cwd: str) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise EnvtestError(f"openssl {' '.join(args)}: {proc.stderr.strip()}")


def _make_certs(d: str, sans: str = "IP:127.0.0.1,DNS:localhost") -> None:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=netsense-envtest-ca", cwd=d)

    def leaf(name: str, subj: str, ext: str | None = None) -> None:
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=d)
        args = ["x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2"]
        if ext:
            with open(os.path.join(d, f"{name}.ext"), "w") as fh:
                fh.write(ext)
            args += ["-extfile", f"{name}.ext"]
        _openssl(*args, cwd=d)

    leaf("server", "/CN=kube-apiserver", f"subjectAltName={sans}\n")
    leaf("admin", "/O=system:masters/CN=netsense-envtest-admin")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


class Supervised:
    """Local processes started and stopped together. Each logs to ``<log_dir>/<name>.log``, runs in a session
    of its own (a terminal's Ctrl-C is ours to handle) and dies with us however we die: a SIGTERM or SIGKILL
    of the test run (a CI timeout) once left etcd and kube-apiserver running, orphaned."""

    log_dir: str
    procs: list[subprocess.Popen]

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str], append: bool = False) -> subprocess.Popen:
        with open(os.path.join(self.log_dir, f"{name}.log"), "a" if append else "w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_die_with_parent)
        self.procs.append(proc)
        return proc

    @staticmethod
    def _terminate(p: subprocess.Popen, grace_s: float = 15) -> None:
        """SIGTERM, and SIGKILL if it has not gone within ``grace_s``."""
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def _check_running(self, waiting_for: str) -> None:
        """Raise, with the end of its log, if one of our processes has exited."""
        for p in self.procs:
            if p.poll() is not None:
                name = os.path.basename(p.args[0])
                with open(os.path.join(self.log_dir, f"{name}.log")) as fh:
                    tail = "".join(fh.readlines()[-8:])
                raise EnvtestError(f"{name} exited with {p.returncode} while waiting for {waiting_for}:\n{tail}")


class ControlPlane(Supervised):
    """etcd + kube-apiserver. With ``address`` and ``for_node`` (support.node), the API server serves a real
    node: it listens where pods reach it, its certificate names the ``kubernetes`` Service, and service
    accounts are admitted (a controller-manager creates them). Its certificates and etcd's data live in a
    directory of their own, made in ``parent_dir`` (the system's temporary directory by default) and removed
    at ``stop``; a supervisor that can be killed before it stops (support.node) puts it where its sweep looks."""

    def __init__(self, bin_dir: str | None = None, log_dir: str | None = None, address: str = "127.0.0.1",
                 for_node: bool = False, port: int = 0, parent_dir: str | None = None):
        self.bin_dir = bin_dir
        self.dir = tempfile.mkdtemp(prefix="netsense-envtest-", dir=parent_dir)
        self.log_dir = log_dir or self.dir
        self.procs: list[subprocess.Popen] = []
        self.address = address
        self.for_node = for_node
        self.port = port
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.port}"

    def start(self, timeout: float = 60) -> None:
        bins = self.bin_dir or binaries_dir()
        d = self.dir
        if self.for_node:  # in-cluster clients reach it as the kubernetes Service (first service IP)
            _make_certs(d, f"IP:127.0.0.1,IP:{self.address},IP:{SERVICE_CIDR.rsplit('.', 1)[0]}.1,DNS:localhost,"
                           "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
                           "DNS:kubernetes.default.svc.cluster.local")
        else:
            _make_certs(d)
        etcd_port, peer_port = free_port(), free_port()
        self._spawn("etcd", [
            os.path.join(bins, "etcd"), "--data-dir", os.path.join(d, "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync", "--log-level", "warn"])
        self.port = self.port or free_port()
        if self.for_node:
            # A controller-manager creates service accounts; the kubelet is reached at its InternalIP
            # (its hostname is not in any DNS the API server uses).
            node_args = ["--kubelet-preferred-address-types=InternalIP"]
        else:
            # No controller-manager creates the default ServiceAccount, so that admission plugin would
            # reject every pod (envtest disables it too); the kubernetes Service's endpoint may not be
            # a loopback address.
            node_args = ["--disable-admission-plugins=ServiceAccount", "--endpoint-reconciler-type=none"]
        self._spawn("kube-apiserver", [
            os.path.join(bins, "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--secure-port={self.port}", f"--bind-address={self.address}", f"--advertise-address={self.address}",
            f"--cert-dir={d}", f"--tls-cert-file={d}/server.crt", f"--tls-private-key-file={d}/server.key",
            f"--client-ca-file={d}/ca.crt", "--authorization-mode=RBAC",
            f"--service-account-issuer={self.server}",
            f"--service-account-key-file={d}/sa.pub", f"--service-account-signing-key-file={d}/sa.key",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true", *node_args,
            "--enable-priority-and-fairness=false", "--v=0"])
        self._write_kubeconfig(self.kubeconfig, {"client-certificate": f"{d}/admin.crt",
                                                 "client-key": f"{d}/admin.key"})
        self._wait_ready(timeout)

    def _write_kubeconfig(self, path: str, user: dict) -> None:
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "envtest",
            "clusters": [{"name": "envtest", "cluster": {"server": self.server,
                                                         "certificate-authority": f"{self.dir}/ca.crt"}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "user",
                                                         "namespace": "default"}}],
        }
        with open(path, "w") as fh:
            yaml.safe_dump(cfg, fh)

    def restart_apiserver(self, down_s: float, timeout: float = 120) -> None:
        """Stop kube-apiserver, leave it down ``down_s`` seconds (etcd keeps the state) and start it again with
        the same flags: what a control-plane crash or upgrade looks like to every client."""
        old = next(p for p in self.procs if os.path.basename(p.args[0]) == "kube-apiserver" and p.poll() is None)
        self._terminate(old)
        self.procs.remove(old)
        time.sleep(down_s)
        self._spawn("kube-apiserver", list(old.args), append=True)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        ctx = ssl.create_default_context(cafile=f"{self.dir}/ca.crt")
        ctx.load_cert_chain(f"{self.dir}/admin.crt", f"{self.dir}/admin.key")
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_running("kube-apiserver to be ready")
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", context=ctx, timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception as e:  # not up yet
                last = str(e)
            time.sleep(0.2)
        raise EnvtestError(f"kube-apiserver not ready after {timeout:.0f}s ({last}); see {self.log_dir}")

    def token_kubeconfig(self, service_account: str, namespace: str, path: str | None = None) -> str:
        """A kubeconfig for a ServiceAccount's token: exactly the rights RBAC gives it."""
        from kubernetes import client, config

        api = client.CoreV1Api(config.new_client_from_config(self.kubeconfig))
        req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[self.server], expiration_seconds=3600))
        token = api.create_namespaced_service_account_token(service_account, namespace, req).status.token
        path = path or os.path.join(self.dir, f"kubeconfig-{namespace}-{service_account}")
        self._write_kubeconfig(path, {"token": token})
        return path

    def stop(self) -> None:
        for p in reversed(self.procs):
            self._terminate(p)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def install_crd(kubeconfig: str, timeout: float = 30) -> None:
    """Apply manifests/base/crd.yaml and wait until it is Established."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    with open(os.path.join(REPO, "manifests", "base", "crd.yaml")) as fh:
        body = yaml.safe_load(fh)
    api = client.ApiextensionsV1Api(config.new_client_from_config(kubeconfig))
    try:
        api.create_custom_resource_definition(body)
    except ApiException as e:
        if e.status != 409:
            raise
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crd = api.read_custom_resource_definition(body["metadata"]["name"])
        if any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])):
            return
        time.sleep(0.2)
    raise EnvtestError("the NetSenseJob CRD never became Established")


def _stop_on(*signals: int) -> None:
    """Raise KeyboardInterrupt on these signals: SIGTERM (a supervisor, a CI timeout) stops the control plane
    as Ctrl-C does, and so does SIGINT where a shell without job control started us with it ignored."""
    def handler(*_):
        raise KeyboardInterrupt
    for sig in signals:
        signal.signal(sig, handler)


if __name__ == "__main__":
    _stop_on(signal.SIGINT, signal.SIGTERM)
    try:  # all of it: a stop may come at any moment, even between the line's flush and print's return
        with ControlPlane() as cp:
            install_crd(cp.kubeconfig)
            print(f"export KUBECONFIG={cp.kubeconfig}   # Ctrl-C or SIGTERM stops the control plane", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
