"""spec.podTemplate: what a cluster needs of a worker pod that the job does not say, merged into the pods the
operator builds. An ALLOW-list: a shaped job runs in a namespace whose Pod Security level is "privileged" (the
shaper needs NET_ADMIN), so Pod Security cannot refuse anything a pod asks for there, and whatever the template
passes through, the operator's service account creates. So it carries only what cannot widen privilege or move
the training traffic off the shaped interface:

    podTemplate:
      metadata: {labels: {...}, annotations: {...}}     # not the operator's, not security or network ones
      spec:
        nodeSelector, affinity, tolerations, topologySpreadConstraints, priorityClassName, schedulerName,
        runtimeClassName, imagePullSecrets,
        volumes: [...]      # persistentVolumeClaim, configMap, secret, emptyDir, projected, csi, ephemeral,
                            # downwardAPI: never hostPath
        containers:         # the trainer only
          - name: trainer
            env, envFrom, volumeMounts, resources

runtimeClassName is allowed: a RuntimeClass is made by a cluster admin (the `nvidia` runtime of a GPU node, a
sandbox such as gVisor) and selects a handler; it cannot add a capability or a host namespace.

Everything else is refused, naming the field and, for the fields a user is likely to try, saying why; the same
rules are CEL rules in the CRD (refused at `kubectl apply`) and checks here (`netsense validate`, the operator).
The shaper is the operator's alone: its image, env, mounts and command come from the operator's configuration.

Merging: labels and annotations are added; lists (volumes, tolerations, ...) are appended to the operator's; maps
(nodeSelector) are merged; other fields are set. The trainer's env, envFrom and volumeMounts are appended, its
resources replace the operator's.
"""

from __future__ import annotations

import copy
import re

from netsense.gang import RENDEZVOUS_ENV, TRAINER, TRANSPORT_ENV, TRANSPORT_ENV_PREFIXES
from netsense.spec import fence
from netsense.spec.fence import OPERATOR_VOLUMES, REFUSED_ANNOTATIONS
from netsense.spec.schema import (
    Bool,
    Errors,
    F,
    Free,
    Int,
    ListOf,
    MapOf,
    Obj,
    Quantity,
    Refused,
    Str,
)

OWNED_LABEL_PREFIX = "netsense.dev/"
# Inline values of variables with these names are refused: the value would travel in the job's YAML, where
# anyone who reads the job reads it. valueFrom.secretKeyRef (or envFrom.secretRef) keeps it a Secret.
CREDENTIAL_NAME = r"(?i)(PASSW|SECRET|TOKEN|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL)"
# A URL that carries a password (scheme://user:password@host), whatever the variable's name. RE2 and Python alike;
# no backslash, so the CEL literal needs no escaping.
CREDENTIAL_URL = r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@ ]*:[^/?#@ ]*@"
_WHY_CREDENTIAL = ("an inline value travels in the job's YAML, readable by anyone who can read the job; use "
                   "valueFrom.secretKeyRef")
# What a shaped trainer may ask for: compute, memory, storage and GPUs. Another device (an RDMA NIC, an EFA or
# SR-IOV interface) would carry the collectives past the shaper, which only sees the pod's eth0.
SHAPED_RESOURCES = ("cpu", "memory", "ephemeral-storage", "nvidia.com/gpu", "amd.com/gpu")
SHAPED_RESOURCE_PREFIXES = ("hugepages-", "nvidia.com/mig-", "gpu.intel.com/")

_MAX_ENV = 128
_NAME = Str(max_length=253)


def _is_transport(name: str) -> bool:
    return name in TRANSPORT_ENV or name.startswith(TRANSPORT_ENV_PREFIXES)


def _transport_cel(var: str) -> str:
    return " || ".join([f"{var} in {list(TRANSPORT_ENV)}", *(f"{var}.startsWith('{p}')" for p in TRANSPORT_ENV_PREFIXES)])


def _check_env_var(e: dict, path: str, errors: Errors) -> None:
    name = e["name"]
    if name in RENDEZVOUS_ENV or name.startswith("NETSENSE_"):
        errors.add(f"{path}.name", f"{name} is set by the operator")
    if "value" in e and re.search(CREDENTIAL_NAME, name):
        errors.add(f"{path}.value", f"{name} looks like a credential: {_WHY_CREDENTIAL}")
    elif re.search(CREDENTIAL_URL, e.get("value") or ""):
        errors.add(f"{path}.value", f"{name}'s value is a URL with a password (scheme://user:password@host): "
                                    f"{_WHY_CREDENTIAL}")


ENV_VAR = Obj({
    "name": F(_NAME, required=True),
    "value": F(Str(max_length=8192)),  # bounded, so that the API server can price its CEL rules
    "valueFrom": F(Free(doc="secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef")),
}, checks=[_check_env_var], cel=[
    {"rule": f"!(self.name in {list(RENDEZVOUS_ENV)} || self.name.startsWith('NETSENSE_'))",
     "message": "this variable is set by the operator", "fieldPath": ".name"},
    {"rule": f"!has(self.value) || !self.name.matches('{CREDENTIAL_NAME}')",
     "message": f"looks like a credential: {_WHY_CREDENTIAL}", "fieldPath": ".value"},
    {"rule": f"!has(self.value) || !self.value.matches('{CREDENTIAL_URL}')",
     "message": f"a URL with a password (scheme://user:password@host): {_WHY_CREDENTIAL}", "fieldPath": ".value"},
])

RESOURCES = Obj({
    "requests": F(MapOf(Quantity(), max_properties=32)),
    "limits": F(MapOf(Quantity(), max_properties=32)),
    "claims": F(Refused("dynamic resource claims are not supported for workers", type="array")),
}, doc="Kubernetes resource requirements")


def _check_trainer(c: dict, path: str, errors: Errors) -> None:
    if c["name"] != TRAINER:
        errors.add(f"{path}.name", _ONLY_TRAINER)


_ONLY_TRAINER = ("only the trainer may be given env, envFrom, volumeMounts and resources here: the shaper, the one "
                 "container with NET_ADMIN, is the operator's alone (its image, env, mounts and command come from "
                 "the operator's configuration)")

def _check_mount(m: dict, path: str, errors: Errors) -> None:
    if m["name"] in OPERATOR_VOLUMES:
        errors.add(f"{path}.name", f"{m['name']!r} is the operator's volume: {_WHY_OPERATOR_VOLUME}")


_WHY_OPERATOR_VOLUME = ("the operator mounts it where it belongs (the shaper's /tmp, read-only for the trainer, "
                        "so that it can plant nothing there)")
VOLUME_MOUNT = Obj({
    "name": F(_NAME, required=True),
    "mountPath": F(Str(), required=True),
    "readOnly": F(Bool()),
    "subPath": F(Str()),
    "subPathExpr": F(Str()),
}, checks=[_check_mount], cel=[{"rule": f"!(self.name in {list(OPERATOR_VOLUMES)})",
                                "message": f"this is the operator's volume: {_WHY_OPERATOR_VOLUME}",
                                "fieldPath": ".name"}])

CONTAINER = Obj({
    "name": F(Str(doc="trainer"), required=True),
    "env": F(ListOf(ENV_VAR, max_items=_MAX_ENV)),
    "envFrom": F(ListOf(Obj({"configMapRef": F(Free()), "secretRef": F(Free()), "prefix": F(Str())}),
                        max_items=32)),
    "volumeMounts": F(ListOf(VOLUME_MOUNT, max_items=32)),
    "resources": F(RESOURCES),
    "image": F(Refused("the trainer's image is spec.image", type="string")),
    "command": F(Refused("the trainer runs `netsense worker`, configured by the job", type="strings")),
    "args": F(Refused("the trainer runs `netsense worker`, configured by the job", type="strings")),
    "securityContext": F(Refused("the trainer runs as a non-root user with no capabilities; the operator sets it")),
}, checks=[_check_trainer], cel=[{"rule": f"self.name == '{TRAINER}'", "message": _ONLY_TRAINER,
                                  "fieldPath": ".name"}])


def _check_volume(v: dict, path: str, errors: Errors) -> None:
    if v["name"] in OPERATOR_VOLUMES:
        errors.add(f"{path}.name", f"{v['name']!r} is the operator's volume")


_PROJECTION = Obj({
    "configMap": F(Free()), "secret": F(Free()), "downwardAPI": F(Free()), "clusterTrustBundle": F(Free()),
    "serviceAccountToken": F(Refused(fence.WHY_NO_TOKEN)),
})

VOLUME = Obj({
    "name": F(Str(max_length=63), required=True),
    "persistentVolumeClaim": F(Free()),
    "configMap": F(Free()),
    "secret": F(Free()),
    "emptyDir": F(Free()),
    "projected": F(Obj({"sources": F(ListOf(_PROJECTION, max_items=16)), "defaultMode": F(Int(min=0))})),
    "csi": F(Free()),
    "ephemeral": F(Free()),
    "downwardAPI": F(Free()),
    "hostPath": F(Refused(fence.WHY_HOST_PATH)),
}, checks=[_check_volume], cel=[{"rule": f"!(self.name in {list(OPERATOR_VOLUMES)})",
                                 "message": "this is the operator's volume", "fieldPath": ".name"}])

POD_SPEC = Obj({
    "nodeSelector": F(MapOf(Str(), max_properties=64)),
    "affinity": F(Free()),
    "tolerations": F(ListOf(Free(), max_items=64)),
    "topologySpreadConstraints": F(ListOf(Free(), max_items=16)),
    "priorityClassName": F(Str()),
    "schedulerName": F(Str(doc="a gang scheduler, e.g. volcano")),
    "runtimeClassName": F(Str(doc="a RuntimeClass a cluster admin made, e.g. nvidia")),
    "imagePullSecrets": F(ListOf(Obj({"name": F(Str(), required=True)}), max_items=16)),
    "volumes": F(ListOf(VOLUME, max_items=64)),
    "containers": F(ListOf(CONTAINER, max_items=1, doc="the trainer's additions")),
    "hostNetwork": F(Refused(fence.WHY_HOST_NETWORK, type="boolean")),
    "hostPID": F(Refused(fence.WHY_HOST_PID, type="boolean")),
    "hostIPC": F(Refused(fence.WHY_HOST_IPC, type="boolean")),
    "hostUsers": F(Refused("the pod's user namespace is the runtime's default", type="boolean")),
    "securityContext": F(Refused("the operator sets the pod's security context (the trainer: non-root, no "
                                 "capabilities, seccomp RuntimeDefault)")),
    "shareProcessNamespace": F(Refused(fence.WHY_SHARE_PROCESSES, type="boolean")),
    "serviceAccountName": F(Refused("workers never talk to the API server (no service account token)", type="string")),
    "automountServiceAccountToken": F(Refused("workers never talk to the API server (no service account token)", type="boolean")),
    "nodeName": F(Refused("skips the scheduler; use nodeSelector or affinity", type="string")),
    "initContainers": F(Refused("the pod's containers are the operator's (the shaper runs first)", type="array")),
    "ephemeralContainers": F(Refused("the pod's containers are the operator's", type="array")),
    "restartPolicy": F(Refused("set by the operator: a failed rank restarts the whole gang", type="string")),
    "hostname": F(Refused("set by the operator (the rank)", type="string")),
    "subdomain": F(Refused("set by the operator", type="string")),
    "dnsPolicy": F(Refused("the pods resolve the rendezvous Service through the cluster's DNS", type="string")),
})


def _check_metadata(m: dict, path: str, errors: Errors) -> None:
    for key in m.get("labels") or {}:
        if key.startswith(OWNED_LABEL_PREFIX):
            errors.add(f"{path}.labels.{key}", "set by the operator (the gang is selected by these)")
    for key in m.get("annotations") or {}:
        if key.startswith(OWNED_LABEL_PREFIX):
            errors.add(f"{path}.annotations.{key}", "set by the operator")
        for prefix, why in REFUSED_ANNOTATIONS.items():
            if key.startswith(prefix):
                errors.add(f"{path}.annotations.{key}", why)


METADATA = Obj({
    "labels": F(MapOf(Str(), max_properties=64)),
    "annotations": F(MapOf(Str(), max_properties=64)),
}, checks=[_check_metadata], cel=[
    {"rule": f"!has(self.labels) || self.labels.all(k, !k.startsWith('{OWNED_LABEL_PREFIX}'))",
     "message": f"labels under {OWNED_LABEL_PREFIX} are set by the operator (the gang is selected by these)",
     "fieldPath": ".labels"},
    *({"rule": f"!has(self.annotations) || self.annotations.all(k, !k.startsWith('{prefix}'))",
       "message": f"an annotation {prefix}... {why}", "fieldPath": ".annotations"}
      for prefix, why in {OWNED_LABEL_PREFIX: "is set by the operator", **REFUSED_ANNOTATIONS}.items()),
])

POD_TEMPLATE = Obj({"metadata": F(METADATA), "spec": F(POD_SPEC)},
                   doc="cluster: merged into every worker pod; an allow-list (see the README's Security section): "
                       "labels, annotations, scheduling (nodeSelector, affinity, tolerations, "
                       "topologySpreadConstraints, priorityClassName, schedulerName, runtimeClassName), "
                       "imagePullSecrets, volumes of the kinds a training job uses (never hostPath), and the "
                       "trainer's env, envFrom, volumeMounts and resources")


# ---- what a shaped job may not ask of its trainer (needs the whole spec: the profile, the template) ----------

def _trainer_containers(spec: dict) -> list[dict]:
    return [c for c in ((spec.get("podTemplate") or {}).get("spec") or {}).get("containers") or [] if c]


def _shaped_resource(name: str) -> bool:
    return name in SHAPED_RESOURCES or name.startswith(SHAPED_RESOURCE_PREFIXES)


def check_shaped(spec: dict, path: str, errors: Errors) -> None:
    """With a profile set, nothing may move the trainer's traffic off the shaped interface: no variable that
    chooses the collectives' interface or network, no device that carries traffic past the shaper."""
    if not (spec.get("network") or {}).get("profile"):
        return
    why = "with a profile set, the collectives must use the shaped interface (the operator pins it)"
    for i, c in enumerate(_trainer_containers(spec)):
        for j, e in enumerate(c.get("env") or []):
            if e and _is_transport(e["name"]):
                errors.add(f"{path}.podTemplate.spec.containers[{i}].env[{j}].name", f"{e['name']}: {why}")
    sources = [("resources", spec.get("resources"))]
    sources += [(f"podTemplate.spec.containers[{i}].resources", c.get("resources"))
                for i, c in enumerate(_trainer_containers(spec))]
    for where, resources in sources:
        for kind in ("requests", "limits"):
            for name in ((resources or {}).get(kind) or {}):
                if not _shaped_resource(name):
                    errors.add(f"{path}.{where}.{kind}.{name}", _DEVICE_WHY)


_DEVICE_WHY = ("with a profile set, the trainer may ask only for cpu, memory, ephemeral-storage, hugepages and "
               "GPUs: another device (an RDMA NIC, say) would carry the collectives past the shaper")


def _resources_cel(var: str) -> str:
    ok = " || ".join([f"k in {list(SHAPED_RESOURCES)}", *(f"k.startsWith('{p}')" for p in SHAPED_RESOURCE_PREFIXES)])
    return " && ".join(f"(!has({var}.{kind}) || {var}.{kind}.all(k, {ok}))" for kind in ("requests", "limits"))


_SHAPED = "has(self.network) && has(self.network.profile)"
_TRAINERS = "has(self.podTemplate) && has(self.podTemplate.spec) && has(self.podTemplate.spec.containers)"
SHAPED_CEL = [
    {"rule": f"!({_SHAPED}) || !({_TRAINERS}) || self.podTemplate.spec.containers.all(c, !has(c.env) || "
             f"c.env.all(e, !({_transport_cel('e.name')})))",
     "message": "with a profile set, the collectives must use the shaped interface: the trainer's env may not set "
                f"{', '.join(TRANSPORT_ENV)} or {'*, '.join(TRANSPORT_ENV_PREFIXES)}*",
     "fieldPath": ".podTemplate.spec.containers"},
    {"rule": f"!({_SHAPED}) || !has(self.resources) || ({_resources_cel('self.resources')})",
     "message": _DEVICE_WHY, "fieldPath": ".resources"},
    {"rule": f"!({_SHAPED}) || !({_TRAINERS}) || "
             f"self.podTemplate.spec.containers.all(c, !has(c.resources) || ({_resources_cel('c.resources')}))",
     "message": _DEVICE_WHY, "fieldPath": ".podTemplate.spec.containers"},
]


# ---- merging into the operator's pod -------------------------------------------------------------------------

def quantities(resources: dict) -> dict:
    """Resource requirements with every quantity a string, as the API's types have them (YAML reads
    `nvidia.com/gpu: 1` as a number, which the Kubernetes client refuses before sending)."""
    return {k: {name: str(q) for name, q in v.items()} if k in ("requests", "limits") and isinstance(v, dict) else v
            for k, v in resources.items()}


def apply(pod: dict, template: dict | None) -> dict:
    """The pod with the (checked) template merged in; the pod itself is left as it was."""
    if not template:
        return pod
    out = copy.deepcopy(pod)
    meta = template.get("metadata") or {}
    for key in ("labels", "annotations"):
        if meta.get(key):
            out["metadata"][key] = {**meta[key], **out["metadata"].get(key, {})}
    spec = out["spec"]
    for key, value in (template.get("spec") or {}).items():
        if key == "containers":
            continue
        if isinstance(value, list):
            spec[key] = spec.get(key, []) + copy.deepcopy(value)
        elif isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **copy.deepcopy(value)}
        else:
            spec[key] = copy.deepcopy(value)
    trainer = next(c for c in spec["containers"] if c["name"] == TRAINER)
    for extra in (template.get("spec") or {}).get("containers") or []:
        for key in ("env", "envFrom", "volumeMounts"):
            if extra.get(key):
                trainer[key] = trainer.get(key, []) + copy.deepcopy(extra[key])
        if extra.get("resources"):
            trainer["resources"] = quantities(extra["resources"])
    return out
