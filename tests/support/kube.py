"""Helpers for tests against the envtest control plane: clients, the operator
process, and a stand-in kubelet that moves pods through their phases."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import yaml
from kubernetes import client, config, utils

from netsense.emulation.loopback import free_port
from netsense.spec import GROUP, PLURAL, VERSION
from support import REPO


class Kube:
    def __init__(self, kubeconfig: str):
        self.kubeconfig = kubeconfig
        self.api = config.new_client_from_config(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def apply_file(self, path: str) -> None:
        with open(path) as fh:
            self.apply([d for d in yaml.safe_load_all(fh) if d])

    def apply(self, docs: list[dict]) -> None:
        """Create each object; one that exists already is fine."""
        for d in docs:
            try:
                utils.create_from_dict(self.api, d)
            except utils.FailToCreateError as e:
                if not all(getattr(x, "status", None) == 409 for x in e.api_exceptions):
                    raise

    def namespace(self, name: str) -> str:
        try:
            self.core.create_namespace({"metadata": {"name": name}})
        except client.ApiException as e:
            if e.status != 409:
                raise
        return name

    def create_job(self, ns: str, name: str, spec: dict) -> dict:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NetSenseJob", "metadata": {"name": name}, "spec": spec}
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

    def delete_jobs(self, ns: str) -> None:
        """Every NetSenseJob of a namespace: a job left Pending is reconciled for the rest of the session, and 50
        of them took enough CPU to fail later timing-sensitive tests (no namespace controller runs here)."""
        for job in self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
            try:
                self.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job["metadata"]["name"])
            except client.ApiException as e:
                if e.status != 404:
                    raise

    def request_counts(self) -> dict[tuple[str, str, str], int]:
        """(verb, resource, subresource) -> requests the API server has answered (its own /metrics)."""
        method, url, headers, body, _ = self.api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
        response = self.api.call_api(method, url, header_params=headers, body=body)
        response.read()
        counts: dict[tuple[str, str, str], int] = {}
        for line in response.data.decode().splitlines():
            if line.startswith("apiserver_request_total{"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
                key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
                counts[key] = counts.get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
        return counts

    def requests(self, verb: str, resource: str) -> int:
        """How many requests of this verb on this resource the API server has answered."""
        return sum(n for (v, r, _), n in self.request_counts().items() if v == verb and r == resource)

    def printed(self, name: str, ns: str) -> dict[str, str]:
        """`kubectl get nsj NAME`'s columns for the job (the API server's Table, as kubectl prints it)."""
        method, url, headers, body, _ = self.api.param_serialize(
            "GET", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}/{name}", auth_settings=["BearerToken"],
            header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
        response = self.api.call_api(method, url, header_params=headers, body=body)
        response.read()
        table = json.loads(response.data)
        names = [c["name"].upper() for c in table["columnDefinitions"]]
        return {n: "" if v is None else str(v) for n, v in zip(names, table["rows"][0]["cells"], strict=True)}

    def job(self, ns: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    def status(self, ns: str, name: str) -> dict:
        return self.job(ns, name).get("status") or {}

    def pods(self, ns: str, job: str, attempt: int | None = None) -> list:
        sel = f"netsense.dev/job={job}" + (f",netsense.dev/attempt={attempt}" if attempt is not None else "")
        return sorted(self.core.list_namespaced_pod(ns, label_selector=sel).items, key=lambda p: p.metadata.name)

    def node(self, name: str, allocatable: dict[str, str] | None = None, labels: dict[str, str] | None = None,
             ready: str = "True", since_s_ago: float = 0, taints: list[dict] | None = None) -> None:
        """A node as its kubelet and node controller would show it (none runs here: nothing schedules onto it by
        itself): Ready (or ``ready``: "Unknown", "False") since ``since_s_ago`` seconds (a fake clock), with
        ``taints``. Called again, it changes them. A Ready one has no not-ready taint (admission puts one on a new
        node, and only the node controller, absent here, takes it off)."""
        try:
            self.core.create_node({"metadata": {"name": name, "labels": labels or {}}})
        except client.ApiException as e:
            if e.status != 409:
                raise
        self.core.patch_node(name, {"spec": {"taints": taints}})
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - since_s_ago))
        status = {"conditions": [{"type": "Ready", "status": ready, "message": "",
                                  "reason": "KubeletReady" if ready == "True" else "NodeStatusUnknown",
                                  "lastTransitionTime": when, "lastHeartbeatTime": when}]}
        if allocatable:
            status.update(allocatable=allocatable, capacity=allocatable)
        self.core.patch_node_status(name, {"status": status})

    def roomy_node(self) -> None:
        """A node with room for every test's gangs (the operator admits a gang only once it fits)."""
        self.node("envtest-roomy", {"cpu": "1000", "memory": "4Ti", "pods": "10000"})

    def bind(self, ns: str, pod: str, node: str, timeout: float = 30) -> None:
        """What the scheduler does: bind the pod to the node, once its gang's gate is lifted."""
        wait_for(lambda: not self.core.read_namespaced_pod(pod, ns).spec.scheduling_gates, timeout=timeout,
                 what=f"{pod}'s gate lifted")
        self.core.create_namespaced_pod_binding(pod, ns, {"metadata": {"name": pod},
                                                          "target": {"kind": "Node", "name": node}},
                                                _preload_content=False)

    def set_pod_phase(self, ns: str, pod: str, phase: str, message: str = "", exit_code: int = 0) -> None:
        """What a kubelet would report for the trainer container."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if phase == "Running":
            state = {"running": {"startedAt": now}}
        else:
            state = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                                    "message": message, "startedAt": now, "finishedAt": now}}
        body = {"status": {"phase": phase, "containerStatuses": [{
            "name": "trainer", "image": "netsense/worker", "imageID": "", "ready": phase == "Running",
            "restartCount": 0, "state": state}]}}
        self.core.patch_namespaced_pod_status(pod, ns, body)


def quick_spec(**over) -> dict:
    """A small shaped job for the operator tests (no pod of it ever runs: the tests play kubelet); a mapping
    given for a key is merged into the default's, anything else replaces it."""
    spec = {"workers": 2, "training": {"model": "mlp", "dataset": "digits", "maxSteps": 50},
            "compression": {"method": "tta"}, "network": {"profile": {"type": "static", "rate": "200Mbit"}},
            "runPolicy": {"backoffLimit": 1}}
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    return spec


def wait_for(predicate, timeout: float = 30, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class OperatorProcess:
    """`netsense operator` as a subprocess with a given kubeconfig."""

    def __init__(self, kubeconfig: str, log_path: str, args: tuple[str, ...] = (), env: dict | None = None):
        self.kubeconfig, self.log_path, self.args, self.env = kubeconfig, log_path, args, env or {}
        self.proc: subprocess.Popen | None = None
        self.metrics_port = free_port()  # for its /metrics (operators in tests share the host's network)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def start(self) -> OperatorProcess:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "NETSENSE_RECONCILE_INTERVAL": "0.5",
               "NETSENSE_METRICS_ADDR": f"127.0.0.1:{self.metrics_port}", **self.env}
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "netsense_operator", *self.args], env=env,
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        with open(self.log_path) as fh:
            return fh.read()

    def identity(self) -> str:
        """The identity its LeaseElector takes: the host, the pid and the start time of this very process
        (netsense_operator.leader.process_identity)."""
        import socket

        with open(f"/proc/{self.proc.pid}/stat") as fh:
            started = fh.read().rsplit(")", 1)[1].split()[19]
        return f"{socket.gethostname()}-{self.proc.pid}-{started}"

    def wait_leading(self, kube: Kube, timeout: float = 30) -> None:
        """Until this process holds the operator's Lease (netsense-system/netsense-operator)."""
        from kubernetes.client import CoordinationV1Api

        leases = CoordinationV1Api(kube.api)

        def holder() -> str:
            try:
                return leases.read_namespaced_lease("netsense-operator", "netsense-system").spec.holder_identity or ""
            except client.ApiException as e:
                if e.status == 404:
                    return ""
                raise
        wait_for(lambda: holder() == self.identity(), timeout=timeout, what="the operator holding the Lease")


@contextlib.contextmanager
def operator_cluster(work: str, interval: str = "10", nodes: bool = False):
    """For the testbed's measurements: etcd + kube-apiserver (envtest) with the CRD and the operator as installed
    (manifests/base: its RBAC, fenced by the admission policy), the operator running with its timer at
    ``interval`` seconds; ``nodes``: a node with room for every gang (else no gang is ever admitted). Yields
    (Kube, OperatorProcess); logs under ``work``."""
    from support.envtest import ControlPlane, binaries_dir, install_crd

    with ControlPlane(binaries_dir(build=True), log_dir=work) as cp:
        install_crd(cp.kubeconfig)
        kube = Kube(cp.kubeconfig)
        for name in ("namespace.yaml", "rbac.yaml", "admission-policy.yaml"):
            kube.apply_file(os.path.join(REPO, "manifests", "base", name))
        if nodes:
            kube.roomy_node()
        op = OperatorProcess(cp.token_kubeconfig("netsense-operator", "netsense-system"),
                             os.path.join(work, "operator.log"), env={"NETSENSE_RECONCILE_INTERVAL": interval})
        op.start()
        try:
            yield kube, op
        finally:
            op.stop()
